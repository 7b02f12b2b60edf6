#!/bin/bash
if grep -qx hello /root/greeting.txt 2>/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo "no greeting"; echo 0 > /logs/verifier/reward.txt; fi
