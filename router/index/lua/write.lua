local function registered(inst) return redis.call('HEXISTS', P .. ':instances', inst) == 1 end
local function slot_of(inst) return redis.call('HGET', P .. ':slot', inst) end

-- The instance in `slot` no longer holds `block`.
local function unhold(block, slot, ttl)
  local key = bkey(block)
  redis.call('SETBIT', key, slot, '0')
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
  if ttl then redis.call('HDEL', tkey(block), slot) end
end

-- Drop the instance's `count` least recently used blocks (leaves before parents).
local function drop_oldest(inst, slot, count, ttl)
  if count <= 0 then return end
  local lru = lkey(inst)
  local victims = redis.call('ZRANGE', lru, 0, count - 1)
  for i = 1, #victims do unhold(victims[i], slot, ttl) end
  if #victims > 0 then redis.call('ZREMRANGEBYRANK', lru, 0, #victims - 1) end
end

-- Drop the blocks not touched for ttl seconds; they sit at the LRU end.
local function expire(inst, slot, now, ttl)
  if not ttl then return end
  local lru = lkey(inst)
  while true do
    local items = redis.call('ZRANGE', lru, 0, 63)
    local k = 0
    for i = 1, #items do
      local t = redis.call('HGET', tkey(items[i]), slot)
      if t and now - tonumber(t) < ttl then break end
      k = i
    end
    for i = 1, k do unhold(items[i], slot, ttl) end
    if k > 0 then redis.call('ZREMRANGEBYRANK', lru, 0, k - 1) end
    if k < #items or #items < 64 then return end
  end
end

local function evict(inst, slot, default_cap, ttl)
  local cap = tonumber(redis.call('HGET', P .. ':cap', inst) or '') or default_cap
  if not cap then return end
  drop_oldest(inst, slot, redis.call('ZCARD', lkey(inst)) - cap, ttl)
end

-- P:names lists the owner of every slot (NUL-joined, '' for a free slot), so that
-- match can answer with slot masks and the client can name them. Field names_v of
-- P:meta changes with every rebuild (server time and a counter), so that a client
-- that already holds this version of the names is not sent them again.
local function rebuild_names()
  local t = redis.call('TIME')
  local gen = redis.call('HINCRBY', P .. ':meta', 'names_gen', 1)
  redis.call('HSET', P .. ':meta', 'names_v', t[1] .. '.' .. t[2] .. ':' .. gen)
  local kv = redis.call('HGETALL', P .. ':slot')
  local names, top = {}, -1
  for i = 1, #kv, 2 do
    local slot = tonumber(kv[i + 1])
    names[slot + 1] = kv[i]
    if slot > top then top = slot end
  end
  if top < 0 then
    redis.call('DEL', P .. ':names')
    return
  end
  for slot = 0, top do names[slot + 1] = names[slot + 1] or '' end
  redis.call('SET', P .. ':names', table.concat(names, '\0'))
end
