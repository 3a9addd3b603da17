//! The control protocol's decoders on arbitrary bytes: never panic; whatever decodes encodes
//! back to the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moneta_abi::control::{self, decode_reply, decode_request, encode_request, MAX_MESSAGE};

fuzz_target!(|data: &[u8]| {
    if let Ok((seq, req)) = decode_request(data) {
        let again = encode_request(seq, &req);
        assert!(again.len() <= MAX_MESSAGE);
        assert_eq!(decode_request(&again).unwrap(), (seq, req));
    }
    for op in [
        control::OP_OPEN_CHANNEL,
        control::OP_GRANT,
        control::OP_STATUS,
        control::OP_PING,
        moneta_abi::fsproto::OP_FS_OPEN,
        moneta_abi::fsproto::OP_FS_STAT,
        moneta_abi::fsproto::OP_FS_LOOKUP,
        moneta_abi::fsproto::OP_FS_READDIR,
        moneta_abi::fsproto::OP_FS_READLINK,
        moneta_abi::fsproto::OP_FS_STATFS,
        moneta_abi::fsproto::OP_FS_LOCK,
    ] {
        let _ = decode_reply(data, op);
    }
    let _ = control::peek_header(data);
});
