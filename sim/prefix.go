package sim

import (
	"cmp"
	"slices"
)

// prefixCache is a rank's cache of computed prompt prefixes: vLLM's
// automatic prefix caching (whole blocks of 16 tokens, each named by a hash
// chained over every token before it) or SGLang's radix cache and the Mac
// engines' prompt caches (block = 1 token). A lookup finds the longest run
// of cached blocks from the start of a prompt, at most its length − 1 (both
// engines always compute the last prompt token to get its logits).
//
// Cached blocks that no running request holds are free memory in the real
// engines (vLLM's usage and SGLang's token usage leave them out), so the
// cache is kept apart from the pool's accounting: it holds up to a pool's
// worth of tokens and drops the least recently used blocks beyond that.
type prefixCache struct {
	block    int
	capacity int               // in blocks
	blocks   map[uint64]uint64 // chained block hash → last use
	tick     uint64
}

// chainPos is how far a sequence's prompt has been added to the cache.
type chainPos struct {
	hash   uint64
	blocks int
}

const chainSeed = 0xcbf29ce484222325 // FNV-1a offset basis

func newPrefixCache(block int, poolTokens int64) *prefixCache {
	return &prefixCache{
		block:    block,
		capacity: max(1, int(poolTokens)/block),
		blocks:   map[uint64]uint64{},
	}
}

func chainHash(h uint64, block []uint32) uint64 {
	for _, t := range block {
		h ^= uint64(t)
		h *= 0x100000001b3 // FNV-1a prime
	}
	return h
}

// lookup returns how many leading tokens of prompt are cached, and marks
// them used.
func (c *prefixCache) lookup(prompt []uint32) int64 {
	c.tick++
	h := uint64(chainSeed)
	n := 0
	for limit := (len(prompt) - 1) / c.block; n < limit; n++ {
		h = chainHash(h, prompt[n*c.block:(n+1)*c.block])
		if _, ok := c.blocks[h]; !ok {
			break
		}
		c.blocks[h] = c.tick
	}
	return int64(n * c.block)
}

// extend caches the whole blocks among the first computed tokens of prompt
// that pos has not added yet, as vLLM and SGLang cache each chunk once it is
// computed.
func (c *prefixCache) extend(pos *chainPos, prompt []uint32, computed int) {
	if pos.blocks == 0 && pos.hash == 0 {
		pos.hash = chainSeed
	}
	c.tick++
	for (pos.blocks+1)*c.block <= computed {
		pos.hash = chainHash(pos.hash, prompt[pos.blocks*c.block:(pos.blocks+1)*c.block])
		c.blocks[pos.hash] = c.tick
		pos.blocks++
	}
	if len(c.blocks) > c.capacity {
		c.evict()
	}
}

// evict drops the least recently used blocks down to 90 % of capacity, so
// that eviction's sort is paid once per tenth of the cache.
func (c *prefixCache) evict() {
	type entry struct{ hash, used uint64 }
	all := make([]entry, 0, len(c.blocks))
	for h, u := range c.blocks {
		all = append(all, entry{h, u})
	}
	slices.SortFunc(all, func(a, b entry) int { return cmp.Compare(a.used, b.used) })
	for _, e := range all[:len(all)-c.capacity*9/10] {
		delete(c.blocks, e.hash)
	}
}
