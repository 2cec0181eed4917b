# Sourced by the model scripts (test_models.sh, real_models.sh): skip NAME REASON... prints a
# visible skip and exits 77, or 1 when CI is set (a missing prerequisite fails CI).
skip() {
  local name=$1
  shift
  echo "$name: SKIP: $*" >&2
  [ -n "${CI:-}" ] && exit 1
  exit 77
}
