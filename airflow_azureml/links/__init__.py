"""Extra links to Azure ML Studio."""
