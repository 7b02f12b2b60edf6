#!/bin/bash
cd /work && touch a.txt b.txt
