package store

import (
	"errors"
	"fmt"
	"hash/crc32"
)

// historyBucket is the name a history entry's checksum covers.
func historyBucket(key []byte) []byte { return append([]byte("history/"), key...) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealLen is the checksum trailer: a NUL (which JSON never holds) and
// eight hex digits of CRC-32C.
const sealLen = 9

// seal appends the checksum of bucket, key and v to v.
func seal(bucket, key, v []byte) []byte {
	out := make([]byte, 0, len(v)+sealLen)
	out = append(out, v...)
	out = append(out, 0)
	return fmt.Appendf(out, "%08x", checksum(bucket, key, v))
}

func checksum(bucket, key, v []byte) uint32 {
	h := crc32.New(castagnoli)
	h.Write(bucket)
	h.Write([]byte{0})
	h.Write(key)
	h.Write([]byte{0})
	h.Write(v)
	return h.Sum32()
}

// errChecksum is a value whose bytes are not the ones written.
var errChecksum = errors.New("the record failed its checksum: its bytes changed on disk")

// unseal checks and removes the checksum.
func unseal(bucket, key, v []byte) ([]byte, error) {
	if len(v) < sealLen || v[len(v)-sealLen] != 0 {
		return nil, errChecksum
	}
	body, sum := v[:len(v)-sealLen], v[len(v)-sealLen+1:]
	var want uint32
	if _, err := fmt.Sscanf(string(sum), "%08x", &want); err != nil || want != checksum(bucket, key, body) {
		return nil, errChecksum
	}
	return body, nil
}
