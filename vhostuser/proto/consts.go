package proto

import "fmt"

// Request is a frontend-to-backend message code (vhost-user.rst, "Front-end
// message types").
type Request uint32

// Frontend requests. Part of the format.
const (
	GetFeatures         Request = 1
	SetFeatures         Request = 2
	SetOwner            Request = 3
	ResetOwner          Request = 4
	SetMemTable         Request = 5
	SetLogBase          Request = 6
	SetLogFD            Request = 7
	SetVringNum         Request = 8
	SetVringAddr        Request = 9
	SetVringBase        Request = 10
	GetVringBase        Request = 11
	SetVringKick        Request = 12
	SetVringCall        Request = 13
	SetVringErr         Request = 14
	GetProtocolFeatures Request = 15
	SetProtocolFeatures Request = 16
	GetQueueNum         Request = 17
	SetVringEnable      Request = 18
	SendRARP            Request = 19
	NetSetMTU           Request = 20
	SetBackendReqFD     Request = 21
	IOTLBMsg            Request = 22
	SetVringEndian      Request = 23
	GetConfig           Request = 24
	SetConfig           Request = 25
	PostcopyAdvise      Request = 28
	PostcopyListen      Request = 29
	PostcopyEnd         Request = 30
	GetInflightFD       Request = 31
	SetInflightFD       Request = 32
	GPUSetSocket        Request = 33
	ResetDevice         Request = 34
	VringKick           Request = 35
	GetMaxMemSlots      Request = 36
	AddMemReg           Request = 37
	RemMemReg           Request = 38
	SetStatus           Request = 39
	GetStatus           Request = 40
)

var requestNames = map[Request]string{
	GetFeatures: "GET_FEATURES", SetFeatures: "SET_FEATURES", SetOwner: "SET_OWNER",
	ResetOwner: "RESET_OWNER", SetMemTable: "SET_MEM_TABLE", SetLogBase: "SET_LOG_BASE",
	SetLogFD: "SET_LOG_FD", SetVringNum: "SET_VRING_NUM", SetVringAddr: "SET_VRING_ADDR",
	SetVringBase: "SET_VRING_BASE", GetVringBase: "GET_VRING_BASE",
	SetVringKick: "SET_VRING_KICK", SetVringCall: "SET_VRING_CALL",
	SetVringErr: "SET_VRING_ERR", GetProtocolFeatures: "GET_PROTOCOL_FEATURES",
	SetProtocolFeatures: "SET_PROTOCOL_FEATURES", GetQueueNum: "GET_QUEUE_NUM",
	SetVringEnable: "SET_VRING_ENABLE", SendRARP: "SEND_RARP", NetSetMTU: "NET_SET_MTU",
	SetBackendReqFD: "SET_BACKEND_REQ_FD", IOTLBMsg: "IOTLB_MSG",
	SetVringEndian: "SET_VRING_ENDIAN", GetConfig: "GET_CONFIG", SetConfig: "SET_CONFIG",
	PostcopyAdvise: "POSTCOPY_ADVISE", PostcopyListen: "POSTCOPY_LISTEN",
	PostcopyEnd: "POSTCOPY_END", GetInflightFD: "GET_INFLIGHT_FD",
	SetInflightFD: "SET_INFLIGHT_FD", GPUSetSocket: "GPU_SET_SOCKET",
	ResetDevice: "RESET_DEVICE", VringKick: "VRING_KICK", GetMaxMemSlots: "GET_MAX_MEM_SLOTS",
	AddMemReg: "ADD_MEM_REG", RemMemReg: "REM_MEM_REG", SetStatus: "SET_STATUS",
	GetStatus: "GET_STATUS",
}

func (r Request) String() string {
	if n, ok := requestNames[r]; ok {
		return n
	}
	return fmt.Sprintf("REQUEST_%d", uint32(r))
}

// BackendRequest is a backend-to-frontend message code, sent on the
// channel SET_BACKEND_REQ_FD hands over (vhost-user.rst, "Back-end message
// types").
type BackendRequest uint32

// Backend requests. Part of the format.
const (
	BackendIOTLBMsg             BackendRequest = 1
	BackendConfigChangeMsg      BackendRequest = 2
	BackendVringHostNotifierMsg BackendRequest = 3
	BackendVringCall            BackendRequest = 4
	BackendVringErr             BackendRequest = 5
)

// Header flags (vhost-user.rst, "Header"). Part of the format.
const (
	FlagVersionMask = 0x3 // bits 0-1: the protocol version
	Version         = 0x1 // the only version
	FlagReply       = 0x4 // the message is a reply
	FlagNeedReply   = 0x8 // the sender wants a REPLY_ACK reply
)

// VHOST_USER_F_PROTOCOL_FEATURES: a feature bit of GET/SET_FEATURES, not a
// virtio one. Offered, it makes GET/SET_PROTOCOL_FEATURES available and
// leaves the rings disabled until SET_VRING_ENABLE.
const FProtocolFeatures = 30

// VHOST_F_LOG_ALL: dirty-page logging for live migration.
const FLogAll = 26

// Protocol feature bits (vhost-user.rst, "Protocol features"). Part of the
// format.
const (
	ProtocolMQ                  = 0
	ProtocolLogShmFD            = 1
	ProtocolRARP                = 2
	ProtocolReplyAck            = 3
	ProtocolNetMTU              = 4
	ProtocolBackendReq          = 5
	ProtocolCrossEndian         = 6
	ProtocolCryptoSession       = 7
	ProtocolPagefault           = 8
	ProtocolConfig              = 9
	ProtocolBackendSendFD       = 10
	ProtocolHostNotifier        = 11
	ProtocolInflightShmFD       = 12
	ProtocolResetDevice         = 13
	ProtocolInbandNotifications = 14
	ProtocolConfigureMemSlots   = 15
	ProtocolStatus              = 16
)

// Virtio device-independent feature bits (virtio 1.2, 6 "Reserved Feature
// Bits"). Part of the format.
const (
	VirtioFNotifyOnEmpty    = 24
	VirtioFAnyLayout        = 27
	VirtioFRingIndirectDesc = 28
	VirtioFRingEventIdx     = 29
	VirtioFVersion1         = 32
	VirtioFAccessPlatform   = 33
	VirtioFRingPacked       = 34
	VirtioFInOrder          = 35
	VirtioFOrderPlatform    = 36
	VirtioFSRIOV            = 37
	VirtioFNotificationData = 38
	VirtioFRingReset        = 40
)

// Bit is the feature mask of bit b: features&Bit(b) != 0 when b is set.
func Bit(b uint) uint64 { return 1 << b }

// Has says whether features has bit b set.
func Has(features uint64, b uint) bool { return features&Bit(b) != 0 }
