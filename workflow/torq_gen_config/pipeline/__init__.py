"""The Snakemake glue: the API wrapper that runs the workflow (workflow_api), the cluster
checks, the scheduler patch, and the job bodies the rules call (steps/)."""
