-- ARGV: P, id.  Forgets the metadata (the slot is recycled once its blocks are cleared);
-- returns the sequence number to clear up to, or -1 for an unknown instance.
local inst = ARGV[2]
local old = redis.call('HGET', P .. ':instances', inst)
if not old then return -1 end
local slot = slot_of(inst)
local spec = cjson.decode(old)
redis.call('SETBIT', mkey('reg'), slot, 0)
redis.call('SETBIT', mkey('tier:' .. spec['tier']), slot, 0)
redis.call('SETBIT', mkey('dc:' .. spec['datacenter']), slot, 0)
redis.call('HDEL', P .. ':instances', inst)
redis.call('HDEL', P .. ':cap', inst)
return tonumber(redis.call('HGET', P .. ':seq', inst) or '0')
