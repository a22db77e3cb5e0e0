package outbox

import "fmt"

// Validator checks a stored outbox stream one row at a time, with the
// findings and precedence of Validate but constant memory, so that a reader
// can validate a stream of any length page by page. The zero value is ready
// for the stream's first row.
type Validator struct {
	// First is the seq of the first row given to Add, for the findings'
	// messages: a reader that starts past a checkpoint sets it. The first
	// row Add sees is the reference for versions.
	First uint64

	rows uint64
	// version is row 0's version byte when row 0 is not empty; every later
	// non-empty row must carry it.
	version   byte
	versioned bool
	mixed     error
	err       error
	prev      uint64
}

// Add checks the next row of the stream. It returns the decoded row and
// true while no row so far had a finding other than a mixed version; once
// Err would report one, it returns false and only keeps looking for mixed
// versions, which Validate reports first.
func (v *Validator) Add(b []byte) (Row, bool) {
	n := v.rows
	v.rows++
	i := v.First + n
	if n == 0 && len(b) > 0 {
		v.version, v.versioned = b[0], true
	}
	if v.mixed == nil && n > 0 && len(b) > 0 && v.versioned && b[0] != v.version {
		v.mixed = fmt.Errorf("%w: row %d has version %d, row %d has %d", ErrMixedVersion, i, b[0], v.First, v.version)
	}
	if v.err != nil {
		return Row{}, false
	}
	r, err := Decode(b)
	if err != nil {
		v.err = fmt.Errorf("row %d: %w", i, err)
		return Row{}, false
	}
	if n > 0 && r.Source <= v.prev {
		v.err = fmt.Errorf("%w: row %d source %d does not follow %d", ErrCorrupt, i, r.Source, v.prev)
		return Row{}, false
	}
	v.prev = r.Source
	return r, v.mixed == nil
}

// Mixed reports whether a mixed version was found: no later row can change
// Err's answer, so a reader may stop.
func (v *Validator) Mixed() bool { return v.mixed != nil }

// Err returns the finding on the rows added so far, as Validate would on
// them: ErrMixedVersion first, else the first row's ErrUnknownVersion or
// ErrCorrupt, else nil.
func (v *Validator) Err() error {
	if v.mixed != nil {
		return v.mixed
	}
	return v.err
}
