#!/bin/sh
# A Streamable HTTP MCP server as a busybox httpd CGI (the Docker test images have nothing else): each POST is one
# JSON-RPC message, answered as JSON; a notification gets 202, a GET (the server's event stream) 405. One tool,
# `served_by`, which says the host name of the container that answers.
if [ "$REQUEST_METHOD" != POST ]; then printf 'Status: 405 Method Not Allowed\r\nContent-Type: text/plain\r\n\r\nno stream\n'; exit 0; fi
body=$(head -c "${CONTENT_LENGTH:-0}")
id=$(printf '%s' "$body" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
method=$(printf '%s' "$body" | sed -n 's/.*"method":"\([^"]*\)".*/\1/p')
if [ -z "$id" ]; then printf 'Status: 202 Accepted\r\nContent-Type: application/json\r\n\r\n'; exit 0; fi
printf 'Content-Type: application/json\r\n\r\n'
case $method in
initialize) printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"cgi","version":"1"}}}' "$id";;
tools/list) printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"served_by","description":"Which service answers.","inputSchema":{"type":"object","properties":{}}}]}}' "$id";;
tools/call) printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"served by %s"}],"isError":false}}' "$id" "$(hostname)";;
*) printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}' "$id";;
esac
