-- Writes log records until the files cannot take more, through ck.log_open
-- (the writer under ck.log). args: dir, mode (sync|async|fsync, or jsonl: sync without an event file), catch
-- (pcall: print what was written; else the error ends the run). Each record's
-- length varies with its step, so the point where the disk or the file size
-- limit stops the files falls at a different place in each record.
local ck = require "ck"
local dir, mode, catch = args[1], args[2], args[3] == "catch"
local sink = ck.log_open{dir = dir, async = mode == "async", fsync = mode == "fsync", flush_interval = 0.05,
                         queue = 8, sigterm = false, tensorboard = mode ~= "jsonl"}
local function write_all()
  for step = 1, 100000 do
    sink:write{step = step, loss = step / 7, pad = string.rep("x", (step * 37) % 211), nested = {a = step, b = {1, 2}}}
    if mode == "async" and step % 5 == 0 then sink:flush() end
  end
  sink:flush()
end
if not catch then
  write_all()
  return
end
local ok, err = pcall(write_all)
local ok2, err2 = pcall(sink.close, sink)
print(string.format("write: %s | close: %s", ok and "ok" or err, ok2 and "ok" or err2))
