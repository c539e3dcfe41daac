-- wrk request generator for the HTTP data-path benchmark.
-- Environment: TOKEN (bearer), METHOD (GET or PUT), BS (bytes per I/O),
-- SIZE (volume bytes), PATTERN (seq or rand).
local bs = tonumber(os.getenv("BS"))
local size = tonumber(os.getenv("SIZE"))
local method = os.getenv("METHOD")
local pattern = os.getenv("PATTERN")
local auth = "Bearer " .. os.getenv("TOKEN")
local body = method == "PUT" and string.rep("x", bs) or nil
local blocks = math.floor(size / bs)
local next_block = 0
math.randomseed(1)

request = function()
  local block
  if pattern == "seq" then
    block = next_block
    next_block = (next_block + 1) % blocks
  else
    block = math.random(0, blocks - 1)
  end
  local first = block * bs
  local last = first + bs - 1
  local headers = {["Authorization"] = auth}
  if method == "PUT" then
    headers["Content-Range"] = "bytes " .. first .. "-" .. last .. "/*"
    return wrk.format("PUT", nil, headers, body)
  end
  headers["Range"] = "bytes=" .. first .. "-" .. last
  return wrk.format("GET", nil, headers)
end
