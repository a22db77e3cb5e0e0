package outbox

import (
	"errors"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
)

// errFields reports an array-encoded row or record whose length is not its
// number of fields, as msgpack's reflective decoder refuses it.
var errFields = errors.New("number of fields in an array-encoded row or record differs")

// Fields of the array form Encode writes.
const (
	rowFields    = 5
	recordFields = 5
)

// preallocLimit bounds the elements a declared array length allocates
// before they are read: a length the bytes do not hold costs no more.
const preallocLimit = 1024

// DecodeMsgpack implements msgpack.CustomDecoder. It reads the array form
// Encode writes through the Decoder's own readers instead of by
// reflection, which allocated about fifteen times a row: a checkpoint of
// a conversation retaining tens of thousands of records decodes as many
// rows (loadRetained), and that garbage was most of what a deaf
// recipient's server grew by at every checkpoint. It accepts exactly what
// the reflective decoder accepts of the array form (FuzzDecode_AsReflection),
// and refuses the map form, which Encode never writes.
func (r *Row) DecodeMsgpack(d *msgpack.Decoder) error {
	if ok, err := openArray(d, rowFields); !ok {
		*r = Row{}
		return err
	}
	var row Row
	var head [2]uint64
	if err := decodeUints(d, head[:]); err != nil {
		return err
	}
	row.Kind, row.Source = RowKind(head[0]), head[1]
	var err error
	if row.Records, err = decodeRecords(d); err != nil {
		return err
	}
	var tail [2]uint64
	if err := decodeUints(d, tail[:]); err != nil {
		return err
	}
	row.Participant, row.Through = oplog.ParticipantID(tail[0]), oplog.Seq(tail[1])
	*r = row
	return nil
}

// openArray reads the array header of a row or record of the given number
// of fields: false, and no error, for a nil or empty array, which decodes
// to the zero value as by reflection.
func openArray(d *msgpack.Decoder, fields int) (bool, error) {
	n, err := d.DecodeArrayLen()
	switch {
	case err != nil:
		return false, err
	case n <= 0:
		return false, nil
	case n != fields:
		return false, errFields
	}
	return true, nil
}

// decodeUints decodes len(dst) unsigned integers in turn.
func decodeUints(d *msgpack.Decoder, dst []uint64) error {
	for i := range dst {
		v, err := d.DecodeUint64()
		if err != nil {
			return err
		}
		dst[i] = v
	}
	return nil
}

func decodeRecords(d *msgpack.Decoder) ([]Record, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n == -1 {
		return nil, err
	}
	out := make([]Record, 0, min(n, preallocLimit))
	for range n {
		var rec Record
		if err := decodeRecord(d, &rec); err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

func decodeRecord(d *msgpack.Decoder, rec *Record) error {
	if ok, err := openArray(d, recordFields); !ok {
		return err
	}
	var f [4]uint64
	if err := decodeUints(d, f[:]); err != nil {
		return err
	}
	rec.Seq, rec.Kind, rec.Participant, rec.Cause = oplog.Seq(f[0]), RecordKind(f[1]), oplog.ParticipantID(f[2]), oplog.Cause(f[3])
	m, err := d.DecodeArrayLen()
	if err != nil || m == -1 {
		return err
	}
	rec.Recipients = make([]oplog.ParticipantID, 0, min(m, preallocLimit))
	for range m {
		q, err := d.DecodeUint64()
		if err != nil {
			return err
		}
		rec.Recipients = append(rec.Recipients, oplog.ParticipantID(q))
	}
	return nil
}
