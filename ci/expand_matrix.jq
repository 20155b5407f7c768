# The test jobs of ci/matrix.json: one per entry, and one per Triton version where an entry lists
# some (the cpu job's axis, "triton": that version); the other entries keep the Triton of their
# vendor's image ("triton": null). The Ascend lowering has a venv of its own, whatever the job's
# Triton: on an axis, only the job of the newest version keeps "ascend_lowering". Run by the
# workflow's matrix job:
#   jq -c -f ci/expand_matrix.jq ci/matrix.json
[ .[] | if (.triton_versions | length) > 0
        then (.triton_versions | last) as $newest
             | .triton_versions[] as $version
             | . + {triton: $version, ascend_lowering: (.ascend_lowering and $version == $newest)}
        else . + {triton: null}
        end ]
