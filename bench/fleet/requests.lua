-- wrk script for bench/fleet/run.py: replays pre-signed telemetry requests, one line each
-- ("device_id<TAB>signature<TAB>body"); thread k of n takes lines k, k+n, ... so no request
-- is sent twice unless the list runs out (run.py reports when it did).
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end

function init(args)
  local nthreads = tonumber(args[2])
  reqs = {}
  local n = 0
  for line in io.lines(args[1]) do
    if n % nthreads == tid then
      local dev, sig, body = line:match("([^\t]+)\t([^\t]+)\t(.*)")
      reqs[#reqs + 1] = wrk.format("POST", "/v1/telemetry", {
        ["Content-Type"] = "application/json", ["X-Device-Id"] = dev,
        ["X-Device-Signature"] = sig}, body)
    end
    n = n + 1
  end
  idx = 0
end

function request()
  idx = idx + 1
  if idx > #reqs then idx = 1 end
  return reqs[idx]
end
