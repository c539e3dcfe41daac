-- wrk request generator for the merge-under-load benchmark: every connection writes
-- the next 4 KiB block of one shared sequence, so concurrent writers interleave on
-- adjacent blocks. Block b holds its number as "%08d", 512 times over, so the test
-- can check every block it wrote. Environment: TOKEN (bearer), BLOCKS (volume size
-- in 4 KiB blocks; the sequence stops short of wrapping).
local auth = "Bearer " .. os.getenv("TOKEN")
local blocks = tonumber(os.getenv("BLOCKS"))
local next_block = 0

request = function()
  local block = next_block
  if next_block < blocks - 1 then
    next_block = next_block + 1
  end
  local first = block * 4096
  local headers = {
    ["Authorization"] = auth,
    ["Content-Range"] = "bytes " .. first .. "-" .. (first + 4095) .. "/*",
  }
  return wrk.format("PUT", nil, headers, string.rep(string.format("%08d", block), 512))
end
