#!/bin/bash
echo goodbye > /root/greeting.txt
