#!/bin/bash
ok=1
for f in web.conf cache.conf; do
    if cmp -s "/app/etc/$f" "/app/backup/$f"; then echo "$f backed up"; else echo "$f missing"; ok=0; fi
done
if [ -e /app/backup/notes.txt ]; then echo "notes.txt should not be there"; ok=0; fi
if ! grep -q 'for f in' /app/backup.sh; then echo "backup.sh was replaced"; ok=0; fi
echo $ok > /logs/verifier/reward.txt
