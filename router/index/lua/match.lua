-- ARGV: P, now, ttl or '', tier or '', datacenter or '', chain (8 bytes per block,
-- big-endian), names version the client holds.  Returns {} when no instance passes the
-- filters, else {version, names, groups}: names is P:names ('' when the client holds
-- this version already), groups is "depth,w:bits,w:bits,...;depth,..." where (w, bits)
-- are the non-zero 32-bit words of the set of slots matched to that depth.
local now = tonumber(ARGV[2])
local ttl = opt_number(ARGV[3])
local tier, dc, chain = ARGV[4], ARGV[5], ARGV[6]
local n = #chain / 8
local floor, byte, format = math.floor, string.byte, string.format

-- The chain comes as binary (half the bytes of hex: Redis's Lua hashes every byte of
-- every string it is given); only the probed blocks are turned into hex key names,
-- with the `struct` library where there is one (Redis), else byte by byte (fakeredis).
local has_struct, st = pcall(function() return struct end)
local unpack_be = has_struct and st and st.unpack
local function key_fmt(infix)
  local head = (P .. infix):gsub('%%', '%%%%')
  if unpack_be then return head .. '%08x%08x' end
  return head .. '%02x%02x%02x%02x%02x%02x%02x%02x'
end
local BFMT, TFMT = key_fmt(':b:'), key_fmt(':t:')
local function key_at(fmt, i)
  if unpack_be then return format(fmt, unpack_be('>I4I4', chain, i * 8 + 1)) end
  return format(fmt, byte(chain, i * 8 + 1, i * 8 + 8))
end

-- 32-bit word operations: Redis ships LuaBitOp as `bit` (signed results); elsewhere
-- (fakeredis) a plain-Lua stand-in on unsigned words. The code below only relies on
-- what both agree on: zero or not, and the bits modulo 2^32.
local has_bit, lib = pcall(function() return bit end)
local band, bnot
if has_bit and lib then
  band, bnot = lib.band, lib.bnot
else
  band = function(a, b)
    a, b = a % 4294967296, b % 4294967296
    local r, p = 0, 1
    while a > 0 and b > 0 do
      local x, y = a % 2, b % 2
      if x == 1 and y == 1 then r = r + p end
      a, b, p = (a - x) / 2, (b - y) / 2, p * 2
    end
    return r
  end
  bnot = function(a) return 4294967295 - a % 4294967296 end
end
-- A set of instances is a mask over slots kept sparse, {w1, bits1, w2, bits2, ...} for
-- its non-zero 32-bit words: slot s is word floor(s / 32), bit 31 - s % 32, which is a
-- SETBIT bitmap read four bytes at a time, big-endian.
local function word_at(s, w)
  local a, b, c, d = byte(s, 4 * w + 1, 4 * w + 4)
  return (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
end
local function words_of(s, other)
  local out, k = {}, 0
  for w = 0, floor((#s - 1) / 4) do
    -- band normalises every word of a mask (LuaBitOp: signed), which keeps the
    -- arithmetic "bits - (bits AND held)" below exact for both stand-ins.
    local v = band(word_at(s, w), other and word_at(other, w) or -1)
    if v ~= 0 then out[k + 1], out[k + 2], k = w, v, k + 2 end
  end
  return out
end
local P2, LOWBIT = {}, {}  -- filled only when a TTL needs them
local function slots_of(mask)
  local out, k = {}, 0
  for j = 1, #mask, 2 do
    local w, bits = mask[j], mask[j + 1]
    while bits ~= 0 do
      local low = band(bits, -bits)
      k = k + 1
      out[k] = w * 32 + 31 - LOWBIT[low]
      bits = band(bits, bnot(low))
    end
  end
  return out
end
local function mask_of(words)
  local out, k = {}, 0
  for w, bits in pairs(words) do out[k + 1], out[k + 2], k = w, band(bits, -1), k + 2 end
  return out
end

-- The registered instances passing the filters.
local all
if tier ~= '' and dc ~= '' then
  local a, b = redis.call('GET', mkey('tier:' .. tier)), redis.call('GET', mkey('dc:' .. dc))
  all = (a and b) and words_of(a, b) or {}
else
  local key = (tier ~= '' and mkey('tier:' .. tier)) or (dc ~= '' and mkey('dc:' .. dc))
    or mkey('reg')
  local a = redis.call('GET', key)
  all = a and words_of(a) or {}
end
if #all == 0 then return {} end

-- Split a mask into the instances that hold a block (per its bitmap) and the others;
-- a side that is the whole mask is the mask itself. The words are gathered in scratch
-- lists first, so that a probe that splits nothing (most do) allocates nothing.
local EMPTY, YS, NS = {}, {}, {}
local function split_mask(held_by, mask)
  if not held_by then return EMPTY, mask end
  local nm, len = #mask, #held_by
  if nm == 2 then  -- one word
    local w, bits = mask[1], mask[2]
    local a, b, c, d = byte(held_by, 4 * w + 1, 4 * w + 4)
    local held = (((a or 0) * 256 + (b or 0)) * 256 + (c or 0)) * 256 + (d or 0)
    local y = band(bits, held)
    if y == 0 then return EMPTY, mask end
    if y == bits then return mask, EMPTY end
    return {w, y}, {w, bits - y}
  end
  local ny, nn = 0, 0
  for j = 1, nm, 2 do
    local w, bits = mask[j], mask[j + 1]
    local at, held = 4 * w, 0
    if at + 4 <= len then
      local a, b, c, d = byte(held_by, at + 1, at + 4)
      held = ((a * 256 + b) * 256 + c) * 256 + d
    elseif at < len then
      local a, b, c = byte(held_by, at + 1, at + 3)
      held = ((a * 256 + (b or 0)) * 256 + (c or 0)) * 256
    end
    local y = band(bits, held)
    if y ~= 0 then YS[ny + 1], YS[ny + 2], ny = w, y, ny + 2 end
    local x = bits - y  -- bits AND NOT held: y's bits are a subset of bits
    if x ~= 0 then NS[nn + 1], NS[nn + 2], nn = w, x, nn + 2 end
  end
  if nn == 0 then return mask, EMPTY end
  if ny == 0 then return EMPTY, mask end
  return {unpack(YS, 1, ny)}, {unpack(NS, 1, nn)}
end

-- Split a mask by the touch times of block idx (only with a TTL).
local function split_time(idx, mask)
  local key = key_at(TFMT, idx)
  local slots = slots_of(mask)
  local fresh, stale = {}, {}
  for c = 1, #slots, CHUNK do
    local last = math.min(c + CHUNK - 1, #slots)
    local fields = {}
    for j = c, last do fields[j - c + 1] = string.format('%d', slots[j]) end
    local vals = redis.call('HMGET', key, unpack(fields))
    for j = c, last do
      local v, s = vals[j - c + 1], slots[j]
      local side = (v and now - tonumber(v) < ttl) and fresh or stale
      local w = floor(s / 32)
      side[w] = (side[w] or 0) + P2[31 - s % 32]
    end
  end
  return mask_of(fresh), mask_of(stale)
end

-- The reply: "depth,w:bits,w:bits;depth,..." built as one flat list of pieces, each
-- group by one string.format (table.concat would print every number with %.14g).
local out, no = {}, 0
local FMTS = {}
local function emit(depth, mask)
  local k = #mask
  if k == 0 then return end
  local fmt = FMTS[k]
  if not fmt then
    fmt = '%d' .. string.rep(',%d:%d', k / 2)
    FMTS[k] = fmt
  end
  if no > 0 then
    no = no + 1
    out[no] = ';'
  end
  no = no + 1
  if k <= 400 then
    out[no] = format(fmt, depth, unpack(mask))
  else  -- a mask of thousands of slots: piece by piece (unpack has a stack limit)
    out[no] = format('%d', depth)
    for j = 1, k, 2 do
      no = no + 1
      out[no] = format(',%d:%d', mask[j], mask[j + 1])
    end
  end
end
local groups = {}
local function collect(depth, mask) groups[#groups + 1] = {depth, mask} end
local sink = ttl and collect or emit

-- Bisect depth first: every instance of a stack entry (lo, hi, mask) holds the first
-- lo blocks and not block hi, so its depth is in [lo, hi]; probing the middle block
-- splits it in two. Cost: about (distinct depths) x log2(hi - lo) probes.
local s_lo, s_hi, s_mask = {}, {}, {}
local function bisect(sp, split, found)
  while sp > 0 do
    local lo, hi, mask = s_lo[sp], s_hi[sp], s_mask[sp]
    sp = sp - 1
    if lo >= hi then
      found(lo, mask)
    else
      local mid = floor((lo + hi) / 2)
      local yes, no_ = split(mid, mask)
      if #yes > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = mid + 1, hi, yes
      end
      if #no_ > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = lo, mid, no_
      end
    end
  end
end

-- The same loop on block bitmaps, specialised: the hot path of every match.
local call = redis.call
local function bisect_bits(sp, found)
  while sp > 0 do
    local lo, hi, mask = s_lo[sp], s_hi[sp], s_mask[sp]
    sp = sp - 1
    if lo >= hi then
      found(lo, mask)
    else
      local mid = floor((lo + hi) / 2)
      local yes, no_ = split_mask(call('GET', key_at(BFMT, mid)), mask)
      if yes[1] then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = mid + 1, hi, yes
      end
      if no_[1] then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = lo, mid, no_
      end
    end
  end
end

-- The first and the last block (one MGET) settle "holds nothing" and "holds everything".
if n == 0 then
  sink(0, all)
else
  local ends = redis.call('MGET', key_at(BFMT, 0), key_at(BFMT, n - 1))
  local first, none = split_mask(ends[1], all)
  sink(0, none)
  if n == 1 then
    sink(1, first)
  elseif #first > 0 then
    local full, rest = split_mask(ends[2], first)
    sink(n, full)
    if #rest > 0 then
      s_lo[1], s_hi[1], s_mask[1] = 1, n - 1, rest
      bisect_bits(1, sink)
    end
  end
end

-- With a TTL, a block held but not touched for ttl seconds is not held. Expiry is
-- monotone too (a store touches parents with their children), so check each group at
-- its deepest block and bisect the expired ones again, on touch times.
if ttl then
  for b = 0, 31 do
    P2[b] = 2 ^ b
    LOWBIT[2 ^ b] = b
  end
  LOWBIT[-2 ^ 31] = 31
  local sp = 0
  for _, g in ipairs(groups) do
    local depth, mask = g[1], g[2]
    if depth == 0 then
      emit(0, mask)
    elseif #mask > 0 then
      local fresh, stale = split_time(depth - 1, mask)
      emit(depth, fresh)
      if #stale > 0 then
        sp = sp + 1
        s_lo[sp], s_hi[sp], s_mask[sp] = 0, depth - 1, stale
      end
    end
  end
  bisect(sp, split_time, emit)
end

local version = redis.call('HGET', P .. ':meta', 'names_v') or ''
local names = ''
if version ~= ARGV[7] then names = redis.call('GET', P .. ':names') or '' end
return {version, names, table.concat(out)}
