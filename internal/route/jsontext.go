package route

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonText reads a JSON text that json.Valid has accepted, without building
// anything. Its methods rely on that and report no syntax errors; on other
// input they stop at its end rather than fail.
type jsonText struct {
	b []byte
	i int // the next byte to read
}

// next skips white space and returns the byte at s.i, or 0 at the end.
func (s *jsonText) next() byte {
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
		default:
			return c
		}
	}
	return 0
}

// str reads the string that starts at s.i and returns its contents as
// written (without the quotes) and whether they hold an escape.
func (s *jsonText) str() (raw []byte, escaped bool) {
	start := s.i + 1
	s.skipString()
	end := max(start, s.i-1) // the closing quote is at s.i-1
	raw = s.b[start:end]
	return raw, bytes.IndexByte(raw, '\\') >= 0
}

// skipString moves s.i past the string that starts at s.i.
func (s *jsonText) skipString() {
	s.i++ // the opening quote
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return
		}
		q := s.i + j
		s.i = q + 1
		// The quote ends the string unless an odd number of backslashes escape it.
		n := 0
		for k := q - 1; k >= 0 && s.b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return
		}
	}
}

// skip moves s.i past the value that starts at the next non-space byte.
func (s *jsonText) skip() {
	switch s.next() {
	case '"':
		s.skipString()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				s.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return
				}
			}
			s.i++
		}
	default:
		s.literal()
	}
}

// literal reads the number, true, false or null that starts at s.i.
func (s *jsonText) literal() []byte {
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return s.b[start:s.i]
		}
	}
	return s.b[start:]
}

// unquote decodes the contents of a JSON string (raw, as str returns them).
// Bytes that are not valid UTF-8 are kept as they are. A \u escape of a
// surrogate that is not part of a pair becomes U+FFFD, as encoding/json
// decodes it, and lone is then true: JavaScript would keep the surrogate, so
// readers of the text disagree on such a string.
func unquote(raw []byte) (s []byte, lone bool) {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			out = append(out, c)
			i++
			continue
		}
		i += 2
		switch e := raw[i-1]; e {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(raw, i)
			if !ok {
				return out, lone
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2, ok2 = hex4(raw, i+2)
				}
				if d := utf16.DecodeRune(r, r2); ok2 && d != utf8.RuneError {
					r = d
					i += 6
				} else {
					r, lone = utf8.RuneError, true
				}
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\' and '/' stand for themselves
			out = append(out, e)
		}
	}
	return out, lone
}

// hex4 reads the four hex digits of a \u escape at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
