"""What every stage uses: errors, names and paths of the output and work directories
(layout), limits, logs, external tools and supervised processes, atomic files, the run
lock, the progress display, output schemas, the stored weights and the work directory's
clean-up. Imports nothing else of the package but workflow_files (where the schemas are)."""
