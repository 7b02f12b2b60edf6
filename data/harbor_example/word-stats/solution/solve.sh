#!/bin/bash
cd /data
wc -l < poem.txt > lines.txt
wc -w < poem.txt > words.txt
tr -cs 'A-Za-z' '\n' < poem.txt | awk 'length > max { max = length; w = $0 } END { print w }' > longest.txt
