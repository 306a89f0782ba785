#!/usr/bin/env bash
# Deploy the queue jobs function app to Azure: resource group, infrastructure (infra/main.bicep),
# the Spark job file (when a Spark backend is chosen), then the code zip with a remote build.
#
# Safe to run again: every step is idempotent (group create, incremental template deployment with
# deterministic names, blob/workspace upload with overwrite, zip deployment of the same package).
# --dry-run prints every command, in order, without running any (the output is itself a script).
#
# Example:
#   deploy/deploy.sh --resource-group rg-jobs --location swedencentral --name-prefix jobs
#   deploy/deploy.sh --resource-group rg-jobs --location swedencentral --name-prefix jobs \
#     --spark-backend livy --spark-url https://WS.dev.azuresynapse.net/livyApi/versions/2019-11-01-preview/sparkPools/POOL \
#     --spark-principal-id <synapse-workspace-identity-object-id> --dry-run
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=deploy/lib.sh
source "$HERE/lib.sh"

usage() {
  cat <<'USAGE'
Usage: deploy/deploy.sh --resource-group RG --location REGION --name-prefix PREFIX [options]

Needs the Azure CLI 2.60.0 or later (Flex Consumption), logged in with az login.

Required:
  --resource-group RG            resource group (created if missing)
  --location REGION              Azure region offering Flex Consumption (e.g. swedencentral)
  --name-prefix PREFIX           2-9 lower-case letters/digits, starting with a letter

Spark (app settings SPARK_*; see docs/deploy.md):
  --spark-backend B              none | standalone | livy | databricks   (default: none)
  --spark-url URL                submission API: Livy endpoint, Databricks workspace URL, or
                                 standalone master REST URL (required unless backend is none)
  --spark-livy-auth A            entra | basic                           (default: entra)
  --spark-livy-user USER         basic auth user (HDInsight) with --spark-livy-auth basic
  --spark-livy-password-secret-uri URI
                                 Key Vault secret URI of that password (a Key Vault reference)
  --spark-py-files URL           where the cluster reads the engine zip (default: next to the job file)
  --spark-job-file PATH          where the cluster reads aggregate_job.py (default: the
                                 spark-jobs container for livy, /Workspace/Shared/queue-jobs/
                                 aggregate_job.py for databricks; required for standalone)
  --spark-job-source PATH        job file to deploy (default: spark_jobs/aggregate_job.py)
  --spark-engine-zip PATH        prebuilt engine zip (pyFiles) to deploy next to it (default:
                                 built with python -m spark_jobs.package)
  --spark-job-dest DEST          standalone only: [user@]host:/path or local path to copy the
                                 job file to (omit to copy it yourself)
  --spark-offload-threshold-bytes N
  --spark-databricks-cluster-id ID
  --databricks-token-secret-uri URI
                                 Key Vault secret URI of a Databricks PAT (only if Entra
                                 auth cannot be used); becomes a Key Vault reference
  --spark-principal-id OID       object id of the Spark service identity: gets Storage Blob
                                 Data Contributor on the account (reads job file/payloads)

Other:
  --subscription ID              az account set --subscription first
  --max-attempts N               MAX_ATTEMPTS (default 5)
  --deployer-object-id OID       who uploads the Spark job file to storage (default: the
                                 signed-in user; "none" to skip the role assignment)
  --deployer-principal-type T    User | ServicePrincipal | Group (default: User)
  --template bicep|json          infra/main.bicep (default) or infra/main.json
  --deployment-name NAME         ARM deployment name (default: PREFIX-infra)
  --package PATH                 zip to build and deploy (default: dist/app.zip)
  --python PATH                  Python used to build the zip (default: .venv/bin/python or python3)
  --skip-infra | --skip-spark-job | --skip-code
  --dry-run                      print the commands, run none
  -h, --help
USAGE
}

RESOURCE_GROUP=""
LOCATION=""
NAME_PREFIX=""
SUBSCRIPTION=""
SPARK_BACKEND="none"
SPARK_URL=""
SPARK_LIVY_AUTH="entra"
SPARK_JOB_FILE=""
SPARK_LIVY_USER=""
SPARK_LIVY_PASSWORD_SECRET_URI=""
SPARK_PY_FILES=""
SPARK_JOB_DEST=""
SPARK_JOB_SOURCE="spark_jobs/aggregate_job.py"
SPARK_ENGINE_ZIP=""
SPARK_OFFLOAD_THRESHOLD_BYTES=""
SPARK_DATABRICKS_CLUSTER_ID=""
DATABRICKS_TOKEN_SECRET_URI=""
SPARK_PRINCIPAL_ID=""
MAX_ATTEMPTS=""
DEPLOYER_OBJECT_ID=""
DEPLOYER_PRINCIPAL_TYPE="User"
TEMPLATE="bicep"
DEPLOYMENT_NAME=""
PACKAGE="dist/app.zip"
PYTHON_BIN=""
SKIP_INFRA=0
SKIP_SPARK_JOB=0
SKIP_CODE=0
DEPLOY_RETRIES=${DEPLOY_RETRIES:-6}
MIN_AZ_VERSION=2.60.0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --resource-group) require_value "$@"; RESOURCE_GROUP=$2; shift 2 ;;
    --location) require_value "$@"; LOCATION=$2; shift 2 ;;
    --name-prefix) require_value "$@"; NAME_PREFIX=$2; shift 2 ;;
    --subscription) require_value "$@"; SUBSCRIPTION=$2; shift 2 ;;
    --spark-backend) require_value "$@"; SPARK_BACKEND=$2; shift 2 ;;
    --spark-url) require_value "$@"; SPARK_URL=$2; shift 2 ;;
    --spark-livy-auth) require_value "$@"; SPARK_LIVY_AUTH=$2; shift 2 ;;
    --spark-job-file) require_value "$@"; SPARK_JOB_FILE=$2; shift 2 ;;
    --spark-livy-user) require_value "$@"; SPARK_LIVY_USER=$2; shift 2 ;;
    --spark-livy-password-secret-uri) require_value "$@"; SPARK_LIVY_PASSWORD_SECRET_URI=$2; shift 2 ;;
    --spark-py-files) require_value "$@"; SPARK_PY_FILES=$2; shift 2 ;;
    --spark-job-dest) require_value "$@"; SPARK_JOB_DEST=$2; shift 2 ;;
    --spark-job-source) require_value "$@"; SPARK_JOB_SOURCE=$2; shift 2 ;;
    --spark-engine-zip) require_value "$@"; SPARK_ENGINE_ZIP=$2; shift 2 ;;
    --spark-offload-threshold-bytes) require_value "$@"; SPARK_OFFLOAD_THRESHOLD_BYTES=$2; shift 2 ;;
    --spark-databricks-cluster-id) require_value "$@"; SPARK_DATABRICKS_CLUSTER_ID=$2; shift 2 ;;
    --databricks-token-secret-uri) require_value "$@"; DATABRICKS_TOKEN_SECRET_URI=$2; shift 2 ;;
    --spark-principal-id) require_value "$@"; SPARK_PRINCIPAL_ID=$2; shift 2 ;;
    --max-attempts) require_value "$@"; MAX_ATTEMPTS=$2; shift 2 ;;
    --deployer-object-id) require_value "$@"; DEPLOYER_OBJECT_ID=$2; shift 2 ;;
    --deployer-principal-type) require_value "$@"; DEPLOYER_PRINCIPAL_TYPE=$2; shift 2 ;;
    --template) require_value "$@"; TEMPLATE=$2; shift 2 ;;
    --deployment-name) require_value "$@"; DEPLOYMENT_NAME=$2; shift 2 ;;
    --package) require_value "$@"; PACKAGE=$2; shift 2 ;;
    --python) require_value "$@"; PYTHON_BIN=$2; shift 2 ;;
    --skip-infra) SKIP_INFRA=1; shift ;;
    --skip-spark-job) SKIP_SPARK_JOB=1; shift ;;
    --skip-code) SKIP_CODE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done

# ---------------------------------------------------------------- validation (before any command)
[[ -n "$RESOURCE_GROUP" ]] || die "--resource-group is required"
[[ -n "$LOCATION" ]] || die "--location is required"
[[ -n "$NAME_PREFIX" ]] || die "--name-prefix is required"
[[ "$NAME_PREFIX" =~ ^[a-z][a-z0-9]{1,8}$ ]] ||
  die "--name-prefix must be 2-9 lower-case letters/digits starting with a letter (storage account naming)"
case "$SPARK_BACKEND" in none | standalone | livy | databricks) ;; *) die "--spark-backend must be none, standalone, livy or databricks" ;; esac
case "$SPARK_LIVY_AUTH" in entra | basic) ;; *) die "--spark-livy-auth must be entra or basic" ;; esac
case "$TEMPLATE" in bicep | json) ;; *) die "--template must be bicep or json" ;; esac
case "$DEPLOYER_PRINCIPAL_TYPE" in User | ServicePrincipal | Group) ;; *) die "--deployer-principal-type must be User, ServicePrincipal or Group" ;; esac
if [[ "$SPARK_BACKEND" != none && -z "$SPARK_URL" ]]; then
  die "--spark-url is required with --spark-backend $SPARK_BACKEND"
fi
if [[ "$SPARK_LIVY_AUTH" == basic && ( -z "$SPARK_LIVY_USER" || -z "$SPARK_LIVY_PASSWORD_SECRET_URI" ) ]]; then
  die "--spark-livy-auth basic needs --spark-livy-user and --spark-livy-password-secret-uri"
fi
if [[ "$SPARK_BACKEND" == standalone && -z "$SPARK_JOB_FILE" ]]; then
  die "--spark-job-file (the path the standalone cluster reads) is required with --spark-backend standalone"
fi
for number in "$MAX_ATTEMPTS" "$SPARK_OFFLOAD_THRESHOLD_BYTES"; do
  [[ -z "$number" || "$number" =~ ^[0-9]+$ ]] || die "not a non-negative integer: $number"
done
[[ -z "$MAX_ATTEMPTS" || "$MAX_ATTEMPTS" -ge 1 ]] || die "--max-attempts must be >= 1"

DEPLOYMENT_NAME=${DEPLOYMENT_NAME:-${NAME_PREFIX}-infra}
TEMPLATE_FILE="infra/main.$TEMPLATE"
if [[ -z "$PYTHON_BIN" ]]; then
  if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON_BIN=.venv/bin/python; else PYTHON_BIN=python3; fi
fi
# Upload of the job file to this deployment's storage (livy) needs a data-plane role for the deployer.
UPLOAD_TO_STORAGE=0
if [[ "$SPARK_BACKEND" == livy && -z "$SPARK_JOB_FILE" && "$SKIP_SPARK_JOB" == 0 ]]; then
  UPLOAD_TO_STORAGE=1
fi

cd "$REPO"
require_tool az "install the Azure CLI and run az login"
# Microsoft's Flex Consumption documentation names Azure CLI 2.60.0 as the minimum. Older versions
# post `config-zip` to Kudu's /api/zipdeploy, which Flex Consumption does not have (its deployments
# go through the OneDeploy endpoint into the deployment container).
require_az_version "$MIN_AZ_VERSION" "Flex Consumption deployments (az functionapp deployment source config-zip) need it"
note "deploy ${NAME_PREFIX} to resource group ${RESOURCE_GROUP} (${LOCATION}); spark backend: ${SPARK_BACKEND}"
[[ "$DRY_RUN" == 1 ]] && note "a real run first checks that the Azure CLI is ${MIN_AZ_VERSION} or later (az version)"

if [[ -n "$SUBSCRIPTION" ]]; then
  run az account set --subscription "$SUBSCRIPTION"
fi

# ---------------------------------------------------------------- 1. infrastructure
if [[ "$SKIP_INFRA" == 0 ]]; then
  if [[ "$UPLOAD_TO_STORAGE" == 1 && -z "$DEPLOYER_OBJECT_ID" ]]; then
    capture DEPLOYER_OBJECT_ID az ad signed-in-user show --query id --output tsv
  fi
  [[ "$DEPLOYER_OBJECT_ID" == none ]] && DEPLOYER_OBJECT_ID=""

  run az group create --name "$RESOURCE_GROUP" --location "$LOCATION" --tags app=queue-jobs --output none

  params=("namePrefix=$NAME_PREFIX" "location=$LOCATION" "sparkBackend=$SPARK_BACKEND" "sparkLivyAuth=$SPARK_LIVY_AUTH")
  [[ -n "$SPARK_URL" ]] && params+=("sparkUrl=$SPARK_URL")
  [[ -n "$SPARK_JOB_FILE" ]] && params+=("sparkJobFile=$SPARK_JOB_FILE")
  [[ -n "$SPARK_PY_FILES" ]] && params+=("sparkPyFiles=$SPARK_PY_FILES")
  [[ -n "$SPARK_LIVY_USER" ]] && params+=("sparkLivyUser=$SPARK_LIVY_USER")
  [[ -n "$SPARK_LIVY_PASSWORD_SECRET_URI" ]] && params+=("sparkLivyPasswordSecretUri=$SPARK_LIVY_PASSWORD_SECRET_URI")
  [[ -n "$SPARK_OFFLOAD_THRESHOLD_BYTES" ]] && params+=("sparkOffloadThresholdBytes=$SPARK_OFFLOAD_THRESHOLD_BYTES")
  [[ -n "$SPARK_DATABRICKS_CLUSTER_ID" ]] && params+=("sparkDatabricksClusterId=$SPARK_DATABRICKS_CLUSTER_ID")
  [[ -n "$DATABRICKS_TOKEN_SECRET_URI" ]] && params+=("sparkDatabricksTokenSecretUri=$DATABRICKS_TOKEN_SECRET_URI")
  [[ -n "$SPARK_PRINCIPAL_ID" ]] && params+=("sparkPrincipalId=$SPARK_PRINCIPAL_ID")
  [[ -n "$MAX_ATTEMPTS" ]] && params+=("maxAttempts=$MAX_ATTEMPTS")
  if [[ -n "$DEPLOYER_OBJECT_ID" ]]; then
    params+=("deployerPrincipalId=$DEPLOYER_OBJECT_ID" "deployerPrincipalType=$DEPLOYER_PRINCIPAL_TYPE")
  fi
  run az deployment group create --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
    --template-file "$TEMPLATE_FILE" --parameters "${params[@]}" --output none
fi

outputs="properties.outputs"
capture FUNCTION_APP az deployment group show --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
  --query "$outputs.functionAppName.value" --output tsv
if [[ "$UPLOAD_TO_STORAGE" == 1 ]]; then
  capture STORAGE_ACCOUNT az deployment group show --resource-group "$RESOURCE_GROUP" --name "$DEPLOYMENT_NAME" \
    --query "$outputs.storageAccountName.value" --output tsv
fi

# ---------------------------------------------------------------- 2. the Spark job file
if [[ "$SPARK_BACKEND" != none && "$SKIP_SPARK_JOB" == 0 ]]; then
  job=(bash deploy/deploy_spark_job.sh --backend "$SPARK_BACKEND" --python "$PYTHON_BIN")
  [[ "$SPARK_JOB_SOURCE" != spark_jobs/aggregate_job.py ]] && job+=(--source "$SPARK_JOB_SOURCE")
  [[ -n "$SPARK_ENGINE_ZIP" ]] && job+=(--engine-zip "$SPARK_ENGINE_ZIP")
  case "$SPARK_BACKEND" in
    livy)
      if [[ -n "$SPARK_JOB_FILE" ]]; then
        note "--spark-job-file given: put the job file (and engine zip) there yourself (deploy/deploy_spark_job.sh --help)"
        job=()
      else
        job+=(--storage-account "$STORAGE_ACCOUNT")
      fi
      ;;
    databricks)
      job+=(--workspace-url "$SPARK_URL")
      [[ -n "$SPARK_JOB_FILE" ]] && job+=(--target "$SPARK_JOB_FILE")
      ;;
    standalone)
      if [[ -n "$SPARK_JOB_DEST" ]]; then
        job+=(--dest "$SPARK_JOB_DEST")
      else
        note "no --spark-job-dest: copy spark_jobs/aggregate_job.py to $SPARK_JOB_FILE on the cluster yourself"
        job=()
      fi
      ;;
  esac
  if [[ ${#job[@]} -gt 0 ]]; then
    [[ "$DRY_RUN" == 1 ]] && job+=(--dry-run)
    # The child prints (and runs) its own commands; it is not a command of this script itself.
    "${job[@]}"
  fi
fi

# ---------------------------------------------------------------- 3. the code
if [[ "$SKIP_CODE" == 0 ]]; then
  run "$PYTHON_BIN" -m deploy.package --out "$PACKAGE"
  # Flex Consumption: az posts the zip to the app's OneDeploy endpoint, the platform stores it in the
  # deployment container (with the identity) and --build-remote installs requirements.txt there, so
  # no dependencies are shipped in the zip. On a first deployment the identity's brand-new role on
  # the storage account may not be effective yet (upload fails with 403): retried, it is idempotent.
  retry "$DEPLOY_RETRIES" 30 az functionapp deployment source config-zip --resource-group "$RESOURCE_GROUP" \
    --name "$FUNCTION_APP" --src "$PACKAGE" --build-remote true --timeout 900
fi

note "done: https://${FUNCTION_APP}.azurewebsites.net/api/health (function keys: az functionapp keys list -g ${RESOURCE_GROUP} -n ${FUNCTION_APP})"
