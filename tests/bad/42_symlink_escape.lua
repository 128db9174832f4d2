-- expect: 42_symlink_escape\.lua:4: reading 'link/hostname' is denied: it is outside the directories the sandbox allows \(--allow-read .*/link allows it\)
-- Reading through a symlink that leads out of the working directory.
local ck = require "ck"
local f = ck.safetensors("link/hostname")
