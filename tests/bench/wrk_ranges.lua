-- wrk request generator for the HTTP data-path benchmark.
-- Environment: TOKEN (bearer), METHOD (GET or PUT), BS (bytes per I/O),
-- SIZE (volume bytes), PATTERN (seq or rand).
-- Every distinct request (one per block) is built once, in init, which wrk runs before it
-- starts its clock, and then reused: building a 1 MiB PUT per request cost wrk a whole core.
-- done prints the CPU wrk spent after init ("client CPU s"): with -t1 that is the load
-- generation itself (os.clock is the process's CPU time, all threads).
local pattern = os.getenv("PATTERN")
local requests = {}
local blocks = 0
local next_block = 1
local cpu_after_init = 0

function init(args)
  local bs = tonumber(os.getenv("BS"))
  local method = os.getenv("METHOD")
  local auth = "Bearer " .. os.getenv("TOKEN")
  local body = method == "PUT" and string.rep("x", bs) or nil
  blocks = math.floor(tonumber(os.getenv("SIZE")) / bs)
  for block = 0, blocks - 1 do
    local first = block * bs
    local last = first + bs - 1
    local headers = {["Authorization"] = auth}
    if method == "PUT" then
      headers["Content-Range"] = "bytes " .. first .. "-" .. last .. "/*"
    else
      headers["Range"] = "bytes=" .. first .. "-" .. last
    end
    requests[block + 1] = wrk.format(method, nil, headers, body)
  end
  math.randomseed(1)
  cpu_after_init = os.clock()
end

request = function()
  if pattern == "seq" then
    local block = next_block
    next_block = next_block % blocks + 1
    return requests[block]
  end
  return requests[math.random(1, blocks)]
end

function done(summary, latency, requests)
  io.write(string.format("client CPU s: %.3f\n", os.clock() - cpu_after_init))
end
