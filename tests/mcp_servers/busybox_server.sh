# A stdio MCP server in busybox sh (the Docker test images have nothing else): one tool, `where`, which says
# the host name and working directory it runs in (and MCP_TEST_VALUE, when set, after a semicolon).
# Run as: sh -c "$(cat busybox_server.sh)"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
  method=$(printf '%s' "$line" | sed -n 's/.*"method":"\([^"]*\)".*/\1/p')
  [ -n "$id" ] || continue
  case $method in
  initialize)
    printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"busybox","version":"1"}}}\n' "$id";;
  tools/list)
    printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"where","description":"The host name and directory the server runs in.","inputSchema":{"type":"object","properties":{}}}]}}\n' "$id";;
  tools/call)
    value=${MCP_TEST_VALUE:+"; value $MCP_TEST_VALUE"}
    printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"host %s in %s%s"}],"isError":false}}\n' "$id" "$(hostname)" "$(pwd)" "$value";;
  *)
    printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}\n' "$id";;
  esac
done
