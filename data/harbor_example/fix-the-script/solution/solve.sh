#!/bin/bash
sed -i 's/\*\.cnf/*.conf/' /app/backup.sh
/app/backup.sh
