-- wrk script: every connection waits WRK_DELAY_MS between requests, so the offered load is about
-- connections * 1000 / WRK_DELAY_MS requests per second instead of "as fast as possible".
local delay_ms = tonumber(os.getenv("WRK_DELAY_MS") or "0")

function delay()
   return delay_ms
end
