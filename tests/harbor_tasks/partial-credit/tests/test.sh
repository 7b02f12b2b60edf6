#!/bin/bash
found=0
for f in a b c; do [ -f "/work/$f.txt" ] && found=$((found + 1)); done
echo "found $found of $EXPECTED files"
printf '{"reward": %s, "files_found": %d, "files_expected": %d, "note": "text is not kept"}\n' \
  "$(awk -v f="$found" -v e="$EXPECTED" 'BEGIN { printf "%.4f", f / e }')" "$found" "$EXPECTED" > /logs/verifier/reward.json
