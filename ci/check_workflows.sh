#!/usr/bin/env bash
# Offline schema check of the GitHub Actions workflows.
#
# Uses check-jsonschema's builtin, vendored copy of the SchemaStore
# "github-workflow" schema (--builtin-schema vendor.github-workflows): no schema
# is downloaded. Install once with: python -m pip install check-jsonschema
#
# Usage: ci/check_workflows.sh [workflow.yml ...]
#   (default: every .github/workflows/*.yml / *.yaml of this repository)
# Exit status: 0 when every file validates, non-zero otherwise (also when
# check-jsonschema is missing or there is nothing to check).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  shopt -s nullglob
  files=("$repo_root"/.github/workflows/*.yml "$repo_root"/.github/workflows/*.yaml)
  shopt -u nullglob
fi

if [ "${#files[@]}" -eq 0 ]; then
  echo "check_workflows: no workflow files found" >&2
  exit 2
fi

if command -v check-jsonschema >/dev/null 2>&1; then
  checker=(check-jsonschema)
elif python3 -c 'import check_jsonschema' >/dev/null 2>&1; then
  checker=(python3 -m check_jsonschema)
else
  echo "check_workflows: check-jsonschema not installed (python -m pip install check-jsonschema)" >&2
  exit 127
fi

exec "${checker[@]}" --builtin-schema vendor.github-workflows "${files[@]}"
