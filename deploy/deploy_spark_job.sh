#!/usr/bin/env bash
# Put the Spark job (spark_jobs/aggregate_job.py) and the engine zip it imports (pyFiles, built by
# `python -m spark_jobs.package`) where the chosen Spark service reads them, and print the
# SPARK_JOB_FILE / SPARK_PY_FILES values the app uses. Idempotent (overwrites); --dry-run prints only.
#
#   livy (Synapse / HDInsight): blob upload with Entra auth (--auth-mode login; the account refuses
#       keys) to the spark-jobs container; the cluster reads abfss://spark-jobs@ACCOUNT.dfs.../FILE.
#   databricks: Workspace import API (or DBFS put) over REST with an Entra token from az (no PAT),
#       or the Databricks CLI (--method cli).
#   standalone: scp to [user@]host:/path, or copy to a local/mounted path.
#
# Examples:
#   deploy/deploy_spark_job.sh --backend livy --storage-account stjobsxxxx
#   deploy/deploy_spark_job.sh --backend databricks --workspace-url https://adb-1.2.azuredatabricks.net
#   deploy/deploy_spark_job.sh --backend standalone --dest spark@master:/opt/jobs/aggregate_job.py
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=deploy/lib.sh
source "$HERE/lib.sh"

# The AzureDatabricks first-party application: the resource to request Entra tokens for.
DATABRICKS_RESOURCE="2ff814a6-3304-4ab8-85cb-cd0e6f879c1d"
ENGINE_NAME="aggregate_engine.zip"

usage() {
  cat <<'USAGE'
Usage: deploy/deploy_spark_job.sh --backend livy|databricks|standalone [options] [--dry-run]

  --source PATH             job file (default: spark_jobs/aggregate_job.py)
  --engine-zip PATH         an already built engine zip (default: build dist/aggregate_engine.zip
                            with `python -m spark_jobs.package`); it goes next to the job file
  --no-engine               deploy the job file only
  --native-wheel PATH       put the C scanner of this aggkernel wheel (built for the cluster's
                            platform, docs/spark.md) into the engine zip built here; without it the
                            executors parse on the Python path
  --python PATH             Python that builds the engine zip (default: .venv/bin/python or python3)
livy (Synapse, HDInsight):
  --storage-account NAME    account to upload to (the deployment's, see the storageAccountName output)
  --container NAME          container (default: spark-jobs)
  --blob-name NAME          blob name of the job file (default: aggregate_job.py)
  --retries N               attempts while a new role assignment propagates (default: 10, 30 s apart)
databricks:
  --workspace-url URL       https://adb-<id>.<n>.azuredatabricks.net
  --target PATH             /Workspace/... (default: /Workspace/Shared/queue-jobs/aggregate_job.py)
                            or dbfs:/... (DBFS put, files up to 1 MB)
  --method rest|cli         REST with an az Entra token (default), or the databricks CLI
standalone:
  --dest DEST               [user@]host:/path (scp) or a local / mounted path of the job file
USAGE
}

BACKEND=""
SOURCE="spark_jobs/aggregate_job.py"
ENGINE_ZIP=""
NATIVE_WHEEL=""
WITH_ENGINE=1
PYTHON_BIN=""
STORAGE_ACCOUNT=""
CONTAINER="spark-jobs"
BLOB_NAME="aggregate_job.py"
RETRIES=10
WORKSPACE_URL=""
TARGET="/Workspace/Shared/queue-jobs/aggregate_job.py"
METHOD="rest"
DEST=""

while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend) require_value "$@"; BACKEND=$2; shift 2 ;;
    --source) require_value "$@"; SOURCE=$2; shift 2 ;;
    --engine-zip) require_value "$@"; ENGINE_ZIP=$2; shift 2 ;;
    --no-engine) WITH_ENGINE=0; shift ;;
    --native-wheel) require_value "$@"; NATIVE_WHEEL=$2; shift 2 ;;
    --python) require_value "$@"; PYTHON_BIN=$2; shift 2 ;;
    --storage-account) require_value "$@"; STORAGE_ACCOUNT=$2; shift 2 ;;
    --container) require_value "$@"; CONTAINER=$2; shift 2 ;;
    --blob-name) require_value "$@"; BLOB_NAME=$2; shift 2 ;;
    --retries) require_value "$@"; RETRIES=$2; shift 2 ;;
    --workspace-url) require_value "$@"; WORKSPACE_URL=${2%/}; shift 2 ;;
    --target) require_value "$@"; TARGET=$2; shift 2 ;;
    --method) require_value "$@"; METHOD=$2; shift 2 ;;
    --dest) require_value "$@"; DEST=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done

# ---------------------------------------------------------------- validation (before any command)
case "$BACKEND" in
  livy) [[ -n "$STORAGE_ACCOUNT" ]] || die "--storage-account is required for livy" ;;
  databricks)
    [[ -n "$WORKSPACE_URL" ]] || die "--workspace-url is required for databricks"
    [[ "$WORKSPACE_URL" == https://* || "$WORKSPACE_URL" == \$\{* ]] || die "--workspace-url must be https://..."
    case "$METHOD" in rest | cli) ;; *) die "--method must be rest or cli" ;; esac
    [[ "$TARGET" == dbfs:/* || "$TARGET" == /Workspace/* ]] || die "--target must start with /Workspace/ or dbfs:/"
    ;;
  standalone) [[ -n "$DEST" ]] || die "--dest is required for standalone" ;;
  "") usage >&2; die "--backend is required" ;;
  *) die "--backend must be livy, databricks or standalone (synapse and hdinsight are livy)" ;;
esac
[[ "$RETRIES" =~ ^[1-9][0-9]*$ ]] || die "--retries must be a positive integer"
[[ -z "$NATIVE_WHEEL" || -z "$ENGINE_ZIP" ]] || die "--native-wheel builds the engine zip: not with --engine-zip"
[[ -z "$NATIVE_WHEEL" || "$WITH_ENGINE" == 1 ]] || die "--native-wheel goes into the engine zip: not with --no-engine"

cd "$REPO"
[[ "$DRY_RUN" == 1 || -f "$SOURCE" ]] || die "job file not found: $SOURCE"
if [[ -z "$PYTHON_BIN" ]]; then
  if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON_BIN=.venv/bin/python; else PYTHON_BIN=python3; fi
fi

# (local file, name at the destination) pairs: the job file, then the engine zip next to it.
LOCAL=("$SOURCE")
if [[ "$WITH_ENGINE" == 1 ]]; then
  if [[ -z "$ENGINE_ZIP" ]]; then
    ENGINE_ZIP="dist/$ENGINE_NAME"
    if [[ -n "$NATIVE_WHEEL" ]]; then
      [[ "$DRY_RUN" == 1 || -f "$NATIVE_WHEEL" ]] || die "wheel not found: $NATIVE_WHEEL"
      run "$PYTHON_BIN" -m spark_jobs.package --native-wheel "$NATIVE_WHEEL" "$ENGINE_ZIP"
    else
      run "$PYTHON_BIN" -m spark_jobs.package "$ENGINE_ZIP"
    fi
  fi
  [[ "$DRY_RUN" == 1 || -f "$ENGINE_ZIP" ]] || die "engine zip not found: $ENGINE_ZIP"
  LOCAL+=("$ENGINE_ZIP")
fi

case "$BACKEND" in
  livy)
    require_tool az
    # Entra auth only: the account has allowSharedKeyAccess=false. The deployer needs Storage Blob
    # Data Contributor (deploy.sh passes deployerPrincipalId to the template for that).
    names=("$BLOB_NAME" "$ENGINE_NAME")
    for i in "${!LOCAL[@]}"; do
      retry "$RETRIES" 30 az storage blob upload --auth-mode login --account-name "$STORAGE_ACCOUNT" \
        --container-name "$CONTAINER" --name "${names[$i]}" --file "${LOCAL[$i]}" --overwrite true --output none
    done
    folder="abfss://${CONTAINER}@${STORAGE_ACCOUNT}.dfs.core.windows.net"
    note "SPARK_JOB_FILE=${folder}/${BLOB_NAME}"
    [[ "$WITH_ENGINE" == 1 ]] && note "SPARK_PY_FILES=${folder}/${ENGINE_NAME}"
    ;;

  databricks)
    if [[ "$TARGET" == dbfs:/* ]]; then
      kind=dbfs
      api_path=${TARGET#dbfs:}
    else
      kind=workspace
      api_path=${TARGET#/Workspace}
    fi
    folder=$(dirname "$api_path")
    remote=("$api_path" "$folder/$ENGINE_NAME")
    if [[ "$METHOD" == cli ]]; then
      require_tool databricks "the Databricks CLI; or use --method rest"
      export DATABRICKS_HOST="$WORKSPACE_URL"
      export DATABRICKS_AUTH_TYPE="${DATABRICKS_AUTH_TYPE:-azure-cli}"
      note "databricks CLI on ${WORKSPACE_URL}, auth ${DATABRICKS_AUTH_TYPE}"
      [[ "$kind" == workspace ]] && run databricks workspace mkdirs "$folder"
      for i in "${!LOCAL[@]}"; do
        if [[ "$kind" == dbfs ]]; then
          run databricks fs cp --overwrite "${LOCAL[$i]}" "dbfs:${remote[$i]}"
        else
          run databricks workspace import "${remote[$i]}" --file "${LOCAL[$i]}" --format AUTO --overwrite
        fi
      done
    else
      require_tool az
      require_tool curl
      capture DATABRICKS_AAD_TOKEN az account get-access-token --resource "$DATABRICKS_RESOURCE" \
        --query accessToken --output tsv
      mask "$DATABRICKS_AAD_TOKEN"
      # The token goes to a 0600 file, never onto a command line.
      # shellcheck disable=SC2016  # printed for the reader, expanded when the output is run
      {
        show 'AUTH_HEADER_FILE=$(mktemp)'
        show 'BODY_FILE=$(mktemp)'
        show "printf 'Authorization: Bearer %s\\n' \"\${DATABRICKS_AAD_TOKEN}\" > \"\${AUTH_HEADER_FILE}\""
      }
      if [[ "$DRY_RUN" == 1 ]]; then
        # shellcheck disable=SC2016
        AUTH_HEADER_FILE='${AUTH_HEADER_FILE}'
        # shellcheck disable=SC2016
        BODY_FILE='${BODY_FILE}'
      else
        AUTH_HEADER_FILE=$(mktemp)
        BODY_FILE=$(mktemp)
        trap 'rm -f "$AUTH_HEADER_FILE" "$BODY_FILE"' EXIT
        chmod 600 "$AUTH_HEADER_FILE" "$BODY_FILE"
        printf 'Authorization: Bearer %s\n' "$DATABRICKS_AAD_TOKEN" >"$AUTH_HEADER_FILE"
      fi
      curl_post=(curl --fail-with-body --silent --show-error --retry 3 -X POST
        -H "@$AUTH_HEADER_FILE" -H "Content-Type: application/json")
      api="$WORKSPACE_URL/api/2.0/$kind"
      run "${curl_post[@]}" "$api/mkdirs" --data "{\"path\": \"$folder\"}"
      for i in "${!LOCAL[@]}"; do
        # Request body: the file base64-encoded, overwrite on (idempotent).
        # shellcheck disable=SC2016
        show "$(print_cmd "$PYTHON_BIN" -m deploy.databricks_body "$kind" "${remote[$i]}" "${LOCAL[$i]}") > \"\${BODY_FILE}\""
        if [[ "$DRY_RUN" != 1 ]]; then
          "$PYTHON_BIN" -m deploy.databricks_body "$kind" "${remote[$i]}" "${LOCAL[$i]}" >"$BODY_FILE"
        fi
        if [[ "$kind" == dbfs ]]; then
          run "${curl_post[@]}" "$api/put" --data "@$BODY_FILE"
        else
          run "${curl_post[@]}" "$api/import" --data "@$BODY_FILE"
        fi
      done
    fi
    prefix=$([[ "$kind" == dbfs ]] && echo "dbfs:" || echo "/Workspace")
    note "SPARK_JOB_FILE=${prefix}${remote[0]}"
    [[ "$WITH_ENGINE" == 1 ]] && note "SPARK_PY_FILES=${prefix}${remote[1]}"
    ;;

  standalone)
    engine_dest="$(dirname "$DEST")/$ENGINE_NAME"
    dests=("$DEST" "$engine_dest")
    for i in "${!LOCAL[@]}"; do
      if [[ "$DEST" =~ ^[^/]*:.+ ]]; then
        require_tool scp
        run scp -q "${LOCAL[$i]}" "${dests[$i]}"
      else
        run install -D -m 0644 "${LOCAL[$i]}" "${dests[$i]}"
      fi
    done
    note "SPARK_JOB_FILE=${DEST#*:}"
    [[ "$WITH_ENGINE" == 1 ]] && note "SPARK_PY_FILES=${engine_dest#*:}"
    ;;
esac
exit 0
