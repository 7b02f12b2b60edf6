#!/bin/bash
# Copies the configuration files into the backup directory.
mkdir -p /app/backup
for f in /app/etc/*.cnf; do
    [ -e "$f" ] || continue
    cp "$f" /app/backup/
done
