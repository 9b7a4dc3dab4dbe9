local unpack = unpack or table.unpack
local P = ARGV[1]
local CHUNK = 1000
local function bkey(block) return P .. ':b:' .. block end
local function tkey(block) return P .. ':t:' .. block end
local function lkey(inst) return P .. ':lru:' .. inst end
local function mkey(name) return P .. ':m:' .. name end
local function hex_at(hex, i) return string.sub(hex, i * 16 + 1, i * 16 + 16) end
local function opt_number(s) if s == '' then return nil end return tonumber(s) end
