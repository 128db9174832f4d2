-- expect: 42_symlink_escape\.lua:4: reading 'link/hostname' \(/etc/hostname\) is denied
-- Reading through a symlink that leads out of the working directory.
local ck = require "ck"
local f = ck.safetensors("link/hostname")
