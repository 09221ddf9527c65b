//go:build fault

package fault

import (
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy that can cut the network between a replica and a
// server the way a partition does: while cut, bytes in either direction
// are dropped (connections hang, nothing is refused) and new connections
// are accepted and go nowhere; restore closes the connections that lived
// through the cut (their streams lost bytes) and forwards new ones again.
// Safe for concurrent use.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool // true: lived through a cut
}

// startProxy listens on addr (":0" for any port) and forwards to target.
func startProxy(addr, target string) (*proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.accept()
	return p, nil
}

// Addr is the proxy's address.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	p.track(c)
	defer p.untrack(c)
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.track(up)
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() { p.pump(up, c); done <- struct{}{} }()
	go func() { p.pump(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

// pump copies from src to dst, dropping what it reads while cut.
func (p *proxy) pump(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *proxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = p.cut
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// Cut starts dropping everything.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		p.conns[c] = true
	}
}

// Restore closes the connections that lived through the cut and forwards again.
func (p *proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for c, cut := range p.conns {
		if cut {
			c.Close()
		}
	}
}

// Close stops the proxy and closes its connections.
func (p *proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}
