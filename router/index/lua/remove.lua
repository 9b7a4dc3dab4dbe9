-- ARGV: P, id, blocks as hex, ttl or ''.  Returns 0 or -1.
local inst = ARGV[2]
if not registered(inst) then return -1 end
local slot = slot_of(inst)
local hex = ARGV[3]
local ttl = opt_number(ARGV[4])
local lru = lkey(inst)
for i = 0, #hex / 16 - 1 do
  local block = hex_at(hex, i)
  if redis.call('ZREM', lru, block) == 1 then unhold(block, slot, ttl) end
end
return 0
