#!/bin/bash
# The sum is 12; the network must be off (allow_internet = false) and the workdir /app.
got=$(tr -d '[:space:]' < /app/sum.txt 2>/dev/null)
echo "sum.txt holds '$got'; working directory $(pwd)"
if [ "$got" = 12 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
