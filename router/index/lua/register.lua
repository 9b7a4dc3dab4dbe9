-- ARGV: P, id, json spec, tier, datacenter, capacity or '', default capacity or '', now, ttl or ''
local inst = ARGV[2]
local ttl = opt_number(ARGV[9])
local slot = slot_of(inst)
if not slot then
  slot = redis.call('LPOP', P .. ':free_slots')
  if not slot then
    slot = string.format('%d', redis.call('HINCRBY', P .. ':meta', 'next_slot', 1) - 1)
  end
  redis.call('HSET', P .. ':slot', inst, slot)
  rebuild_names()
end
local old = redis.call('HGET', P .. ':instances', inst)
if old then
  local spec = cjson.decode(old)
  redis.call('SETBIT', mkey('tier:' .. spec['tier']), slot, 0)
  redis.call('SETBIT', mkey('dc:' .. spec['datacenter']), slot, 0)
end
redis.call('HSET', P .. ':instances', inst, ARGV[3])
redis.call('SETBIT', mkey('reg'), slot, 1)
redis.call('SETBIT', mkey('tier:' .. ARGV[4]), slot, 1)
redis.call('SETBIT', mkey('dc:' .. ARGV[5]), slot, 1)
if ARGV[6] == '' then
  redis.call('HDEL', P .. ':cap', inst)
else
  redis.call('HSET', P .. ':cap', inst, ARGV[6])
end
expire(inst, slot, tonumber(ARGV[8]), ttl)
evict(inst, slot, opt_number(ARGV[7]), ttl)
return 0
