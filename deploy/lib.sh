# shellcheck shell=bash
# shellcheck disable=SC2016  # '${NAME}' / '$(...)' are printed on purpose, not expanded
# Helpers shared by deploy/deploy.sh and deploy/deploy_spark_job.sh (sourced, not executed).
#
# Every external command goes through `run` or `capture`, which print it first (one line, shell
# quoted, secrets masked) and execute it unless DRY_RUN=1. In a dry run a captured value becomes a
# `${NAME}` placeholder, and the printed lines form a script that does the same as the real run.

DRY_RUN=${DRY_RUN:-0}
MASK_VALUES=()

die() {
  echo "error: $*" >&2
  exit 2
}

note() {
  # Information, printed as a shell comment so dry-run output stays a valid script.
  echo "# $*"
}

show() {
  # A command line written out as is (for steps done in-process, e.g. writing a temp file).
  printf '%s\n' "$1"
}

mask() {
  # Never print this value (a token, a password); show ***MASKED*** instead.
  [[ -n "$1" ]] && MASK_VALUES+=("$1")
  return 0
}

quote_arg() {
  local arg=$1 m
  for m in "${MASK_VALUES[@]+"${MASK_VALUES[@]}"}"; do
    arg=${arg//"$m"/***MASKED***}
  done
  if [[ "$arg" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$arg"
  elif [[ "$DRY_RUN" == 1 && "$arg" =~ \$\{[A-Z_]+\} && "$arg" != *[\"\`\\]* ]]; then
    printf '"%s"' "$arg"  # keeps a ${PLACEHOLDER} expandable when the output is run as a script
  else
    printf "'%s'" "${arg//\'/\'\\\'\'}"
  fi
}

print_cmd() {
  local out="" arg
  for arg in "$@"; do
    out+="$(quote_arg "$arg") "
  done
  printf '%s\n' "${out% }"
}

run() {
  print_cmd "$@"
  if [[ "$DRY_RUN" != 1 ]]; then
    "$@"
  fi
}

# capture NAME command...: NAME=$(command), printed as such; "${NAME}" in a dry run.
capture() {
  local name=$1
  shift
  printf '%s=$(%s)\n' "$name" "$(print_cmd "$@")"
  if [[ "$DRY_RUN" == 1 ]]; then
    printf -v "$name" '${%s}' "$name"
  else
    local value
    value=$("$@") || die "command failed: $(print_cmd "$@")"
    value=${value%$'\n'}
    value=${value%$'\r'}
    [[ -n "$value" ]] || die "command printed nothing: $(print_cmd "$@")"
    printf -v "$name" '%s' "$value"
  fi
}

# retry ATTEMPTS DELAY_S command...: for what waits on role assignments to propagate (minutes).
retry() {
  local attempts=$1 delay=$2 i
  shift 2
  print_cmd "$@"
  [[ "$DRY_RUN" == 1 ]] && return 0
  for ((i = 1; i <= attempts; i++)); do
    if "$@"; then
      return 0
    fi
    if ((i < attempts)); then
      note "attempt $i/$attempts failed (a new role assignment can take minutes to apply); retrying in ${delay}s"
      sleep "$delay"
    fi
  done
  die "gave up after $attempts attempts: $(print_cmd "$@")"
}

require_value() {
  # require_value --option "$2": an option that takes a value must have one.
  [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

require_tool() {
  [[ "$DRY_RUN" == 1 ]] && return 0
  command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH${2:+ ($2)}"
}

# version_ge A B: true when dotted version A >= B (numeric per part; missing parts are 0).
version_ge() {
  local -a a b
  local i n x y
  IFS=. read -r -a a <<<"$1"
  IFS=. read -r -a b <<<"$2"
  n=${#a[@]}
  ((${#b[@]} > n)) && n=${#b[@]}
  for ((i = 0; i < n; i++)); do
    x=${a[i]:-0}
    y=${b[i]:-0}
    x=${x%%[!0-9]*}
    y=${y%%[!0-9]*}
    ((10#${x:-0} > 10#${y:-0})) && return 0
    ((10#${x:-0} < 10#${y:-0})) && return 1
  done
  return 0
}

# azure_cli_version: the installed Azure CLI's version, from `az version` (JSON, CLI 2.11+) or,
# failing that, from the first line of `az --version`. Prints nothing when neither can be read.
azure_cli_version() {
  local out version
  out=$(az version --output json 2>/dev/null) || out=""
  version=$(printf '%s\n' "$out" | sed -n 's/^[[:space:]{]*"azure-cli"[[:space:]]*:[[:space:]]*"\([0-9][0-9.]*\)".*/\1/p' | head -n 1)
  if [[ -z "$version" ]]; then
    out=$(az --version 2>/dev/null) || out=""
    version=$(printf '%s\n' "$out" | sed -n 's/^azure-cli[[:space:]]\{1,\}\([0-9][0-9.]*\).*/\1/p' | head -n 1)
  fi
  printf '%s' "$version"
}

# require_az_version MIN WHY: stop unless the Azure CLI is at least MIN (real runs only, like
# require_tool: a dry run runs nothing).
require_az_version() {
  [[ "$DRY_RUN" == 1 ]] && return 0
  local min=$1 why=$2 found
  found=$(azure_cli_version)
  [[ -n "$found" ]] || die "could not read the Azure CLI version (az version / az --version); Azure CLI $min or later is required: $why"
  version_ge "$found" "$min" && return 0
  die "Azure CLI $found found, $min or later required: $why. Upgrade with 'az upgrade', or install the current CLI from Microsoft's package repository (https://learn.microsoft.com/cli/azure/install-azure-cli); a distribution's own azure-cli package (e.g. Debian's) is usually too old"
}
