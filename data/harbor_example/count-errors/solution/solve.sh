#!/bin/bash
awk '$2 == "ERROR"' /app/service.log | wc -l > /app/errors.txt
