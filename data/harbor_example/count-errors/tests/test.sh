#!/bin/bash
got=$(tr -d '[:space:]' < /app/errors.txt 2>/dev/null)
echo "errors.txt holds '$got' (expected 3)"
if [ "$got" = 3 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
