// Loom's e2e build of github.com/google/nftables@v0.3.0's expr/queue.go, swapped in by
// build_netpol.sh (go build -overlay): a Queue is sent to the kernel as the xtables NFQUEUE target
// (revision 3) through nft_compat instead of nftables' own queue expression. The kernels of
// Loom's machines are built without CONFIG_NFT_QUEUE (`nft add rule ... queue num 100` fails
// with "No such file or directory") but with CONFIG_NFT_COMPAT and
// CONFIG_NETFILTER_XT_TARGET_NFQUEUE, the path iptables-nft's `-j NFQUEUE` takes. Both hand the
// packet to the same nfnetlink queue with the same bypass and fanout flags (xt_NFQUEUE's
// NFQ_FLAG_BYPASS and NFQ_FLAG_CPU_FANOUT are nftables' NFT_QUEUE_FLAG_* values). The API is
// upstream's; only the encoding differs.

package expr

import (
	"encoding/binary"

	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type QueueAttribute uint16

type QueueFlag uint16

// Possible QueueAttribute values
const (
	QueueNum   QueueAttribute = unix.NFTA_QUEUE_NUM
	QueueTotal QueueAttribute = unix.NFTA_QUEUE_TOTAL
	QueueFlags QueueAttribute = unix.NFTA_QUEUE_FLAGS

	QueueFlagBypass QueueFlag = unix.NFT_QUEUE_FLAG_BYPASS
	QueueFlagFanout QueueFlag = unix.NFT_QUEUE_FLAG_CPU_FANOUT
	QueueFlagMask   QueueFlag = unix.NFT_QUEUE_FLAG_MASK
)

type Queue struct {
	Num   uint16
	Total uint16
	Flag  QueueFlag
}

func (e *Queue) marshal(fam byte) ([]byte, error) {
	data, err := e.marshalData(fam)
	if err != nil {
		return nil, err
	}
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_EXPR_NAME, Data: []byte("target\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
	})
}

// marshalData encodes struct xt_NFQ_info_v3 {__u16 queuenum, queues_total, flags}, in host byte
// order and padded to XT_ALIGN (8 bytes), as the NFQUEUE target's info.
func (e *Queue) marshalData(fam byte) ([]byte, error) {
	if e.Total == 0 {
		e.Total = 1 // The total default value is 1
	}
	info := make([]byte, 8)
	binary.NativeEndian.PutUint16(info[0:], e.Num)
	binary.NativeEndian.PutUint16(info[2:], e.Total)
	binary.NativeEndian.PutUint16(info[4:], uint16(e.Flag))
	return netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_TARGET_NAME, Data: []byte("NFQUEUE\x00")},
		{Type: unix.NFTA_TARGET_REV, Data: binaryutil.BigEndian.PutUint32(3)},
		{Type: unix.NFTA_TARGET_INFO, Data: info},
	})
}

func (e *Queue) unmarshal(fam byte, data []byte) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_QUEUE_NUM:
			e.Num = ad.Uint16()
		case unix.NFTA_QUEUE_TOTAL:
			e.Total = ad.Uint16()
		case unix.NFTA_QUEUE_FLAGS:
			e.Flag = QueueFlag(ad.Uint16())
		}
	}
	return ad.Err()
}
