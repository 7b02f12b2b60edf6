#!/bin/bash
echo "verifying slowly"
sleep 120
echo 1 > /logs/verifier/reward.txt
