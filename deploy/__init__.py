"""Deployment tooling: packaging (deploy.package) and the az wrappers (deploy.sh, deploy_spark_job.sh)."""
