"""Starting and stopping deployments, and the `moa-pd` command line."""
