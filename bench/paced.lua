-- wrk script: paced load instead of "as fast as possible" (one wrk thread: -t1).
--
-- WRK_RATE=R      a fixed schedule of R requests/s for the whole run (open loop, as wrk2 does, without
--                 its latency correction): each request waits for its slot; a late one goes at once,
--                 so a slow server meets a backlog rather than a gentler load. Needs LuaJIT (wrk's).
-- WRK_DELAY_MS=D  every connection waits D ms between its requests (closed loop): the offered load is
--                 about connections * 1000 / D requests/s, less the latency.
local rate = tonumber(os.getenv("WRK_RATE") or "")
local delay_ms = tonumber(os.getenv("WRK_DELAY_MS") or "0")

if rate then
   local ffi = require("ffi")
   ffi.cdef[[
      typedef struct { long tv_sec; long tv_nsec; } paced_timespec;
      int clock_gettime(int clock, paced_timespec *ts);
   ]]
   local ts = ffi.new("paced_timespec")
   local interval = 1000 / rate
   local slot = nil

   local function now_ms()
      ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
      return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
   end

   function delay()
      local now = now_ms()
      if slot == nil or slot < now - 1000 then slot = now end  -- more than 1 s behind: start afresh
      local wait = slot - now
      slot = slot + interval
      if wait <= 0 then return 0 end
      return math.floor(wait + 0.5)  -- wrk's timers have ms resolution
   end
else
   function delay()
      return delay_ms
   end
end
