-- interrupt after: 1
-- expect: 60_endless_loop_sigint\.lua:[67]: interrupted
-- An endless loop at the top of a script, stopped by Ctrl-C (SIGINT).
local n = 0
while true do
  n = n + 1
end
