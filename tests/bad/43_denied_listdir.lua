-- expect: 43_denied_listdir\.lua:3: reading '/' is denied: .*--allow-read / allows it
-- Listing the root directory.
local names = require("ck").listdir("/")
