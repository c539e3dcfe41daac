-- wrk request generator for the batched I/O benchmark: every distinct request is
-- built once at start and replayed, so wrk's own CPU stays far below a core.
-- Environment: TOKEN (bearer), METHOD (GET or PUT), BS (bytes per I/O),
-- SIZE (volume bytes), BATCH (I/Os per request: 1 = plain Range / Content-Range).
local bs = tonumber(os.getenv("BS"))
local size = tonumber(os.getenv("SIZE"))
local batch = tonumber(os.getenv("BATCH"))
local method = os.getenv("METHOD")
local auth = "Bearer " .. os.getenv("TOKEN")
local boundary = "wrk-batch-boundary"
local distinct = 256
local requests = {}
local next_request = 0

init = function(args)
  math.randomseed(1)
  local blocks = math.floor(size / bs)
  local payload = string.rep("x", bs)
  for i = 1, distinct do
    local headers = {["Authorization"] = auth}
    local ranges, parts = {}, {}
    for j = 1, batch do
      local first = math.random(0, blocks - 1) * bs
      local last = first + bs - 1
      ranges[j] = first .. "-" .. last
      parts[j] = "--" .. boundary .. "\r\nContent-Range: bytes " .. first .. "-" .. last
        .. "/*\r\n\r\n" .. payload .. "\r\n"
    end
    if method == "GET" then
      headers["Range"] = "bytes=" .. table.concat(ranges, ",")
      requests[i] = wrk.format("GET", nil, headers)
    elseif batch == 1 then
      headers["Content-Range"] = "bytes " .. ranges[1] .. "/*"
      requests[i] = wrk.format("PUT", nil, headers, payload)
    else
      headers["Content-Type"] = "multipart/byteranges; boundary=" .. boundary
      requests[i] = wrk.format("PUT", nil, headers, table.concat(parts) .. "--" .. boundary .. "--\r\n")
    end
  end
end

request = function()
  next_request = next_request % distinct + 1
  return requests[next_request]
end
