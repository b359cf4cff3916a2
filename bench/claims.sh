# Sourced by every bench/ script that claims something (equal logits, tests passed): a claim that
# does not hold is said on its own line and makes the script exit 1 at its end (end_claims), so a
# mismatch can never end "done" with exit 0. The scripts run without `set -e` (a benchmark goes
# on after a failed step to show what else it can), hence this explicit record.
CLAIMS_FAILED=0

# same_bytes A B WHAT: "logits: WHAT, byte for byte" when files A and B hold the same bytes, else
# "LOGITS DIFFER: WHAT" (a missing file differs), the claim fails and it returns 1 (for an
# `|| tail log` after it).
same_bytes() {
  if cmp -- "$1" "$2"; then
    echo "logits: $3, byte for byte"
  else
    echo "LOGITS DIFFER: $3 ($1 against $2)"
    CLAIMS_FAILED=1
    return 1
  fi
}

# claim_failed WHAT: a claim checked by the script itself did not hold.
claim_failed() {
  echo "CLAIM FAILED: $1"
  CLAIMS_FAILED=1
}

# end_claims: the script's last line: "== done" and exit 0 when every claim held, else exit 1.
end_claims() {
  if [ "$CLAIMS_FAILED" = 0 ]; then
    echo "== done"
  else
    echo "== done, BUT A CLAIM FAILED (see LOGITS DIFFER / CLAIM FAILED above)"
    exit 1
  fi
}
