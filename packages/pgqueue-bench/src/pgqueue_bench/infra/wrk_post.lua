-- wrk script of the enqueue and api drivers (pgqueue bench enqueue, pgqueue bench api):
-- every request POSTs the JSON body in the file named by the script's first argument,
-- with the bearer token of the second if there is one, and at the end one line starting
-- "wrk-json " carries what wrk counted, for the driver to read.
--
--   wrk --script wrk_post.lua http://127.0.0.1:PORT/jobs -- body.json [TOKEN]

function init(args)
   local file = assert(io.open(args[1], "rb"))
   wrk.method = "POST"
   wrk.body = file:read("*a")
   file:close()
   wrk.headers["Content-Type"] = "application/json"
   if args[2] then
      wrk.headers["Authorization"] = "Bearer " .. args[2]
   end
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format(
      'wrk-json {"requests": %d, "duration_us": %d, "errors": {"connect": %d, "read": %d, '
         .. '"write": %d, "status": %d, "timeout": %d}, "latency_us": {"p50": %.1f, '
         .. '"p99": %.1f, "mean": %.1f, "max": %.1f}}\n',
      summary.requests, summary.duration, errors.connect, errors.read, errors.write,
      errors.status, errors.timeout, latency:percentile(50), latency:percentile(99),
      latency.mean, latency.max))
end
