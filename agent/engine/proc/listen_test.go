package proc

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Lines as a little-endian Linux prints them (x86-64, arm64): two
// listeners on 8000 (every IPv4 interface, and 10.0.0.5 alone), one on
// loopback 41019, and an established connection from 8000 that is not a
// listener.
const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 142 1 000000009de20fe2 100 0 0 10 0
   1: 0100007F:A03B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 673821 2 0000000096101f7d 100 0 0 10 0
   2: 0500000A:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 673822 2 0000000096101f7d 100 0 0 10 0
   3: 0500000A:1F40 0600000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 673823 2 0000000096101f7d 100 0 0 10 0
`

const procNetTCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F42 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
`

func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

func TestParseProcNetTCP(t *testing.T) {
	if !littleEndian() {
		t.Skip("the fixtures are a little-endian kernel's")
	}
	for _, tc := range []struct {
		text string
		port int
		want []string
	}{
		{procNetTCP, 8000, []string{"0.0.0.0:8000", "10.0.0.5:8000"}},
		{procNetTCP, 41019, []string{"127.0.0.1:41019"}},
		{procNetTCP, 9, nil},
		{procNetTCP6, 8000, []string{"[::]:8000"}},
		{procNetTCP6, 8001, []string{"[::1]:8001"}},
		{procNetTCP6, 8002, []string{"127.0.0.1:8002"}}, // a v4-mapped listener is the v4 address
	} {
		got, err := parseProcNetTCP(strings.NewReader(tc.text), tc.port)
		if err != nil {
			t.Fatalf("port %d: %v", tc.port, err)
		}
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if !slices.Equal(s, tc.want) {
			t.Errorf("port %d: %v, want %v", tc.port, s, tc.want)
		}
	}
	bad := "header\n 0: 0100007:1F40 00000000:0000 0A x\n"
	if _, err := parseProcNetTCP(strings.NewReader(bad), 8000); err == nil {
		t.Error("a 7-digit address was read")
	}
}

// A real loopback listener, found as loopback only; and nothing on a port
// no one listens on.
func TestListenAddrsLive(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	got, err := ListenAddrs(context.Background(), port)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort(ln.Addr().String()); !slices.Equal(got, []netip.AddrPort{want}) {
		t.Errorf("ListenAddrs(%d) = %v, want [%s] (%s)", port, got, want, runtime.GOOS)
	}
	ln.Close()
	if got, err := ListenAddrs(context.Background(), port); err != nil || len(got) != 0 {
		t.Errorf("after close: %v, %v", got, err)
	}
	if _, err := ListenAddrs(context.Background(), 70000); err == nil {
		t.Error("port 70000 accepted")
	}
}
