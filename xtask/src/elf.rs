//! Just enough ELF to tell a static binary from a dynamically linked one.

/// `PT_INTERP`: the program header naming the dynamic loader.
const PT_INTERP: u32 = 3;

fn u16_le(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Whether `binary`, a little-endian ELF64 file, asks for a dynamic loader
/// (`PT_INTERP`). Static and static-pie binaries do not. Anything that is not a
/// little-endian ELF64 file is reported as not having one.
pub fn has_interpreter(binary: &[u8]) -> bool {
    interpreter(binary).unwrap_or(false)
}

fn interpreter(b: &[u8]) -> Option<bool> {
    // e_ident: magic, EI_CLASS = ELFCLASS64 (2), EI_DATA = ELFDATA2LSB (1).
    if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let phoff = usize::try_from(u64_le(b, 0x20)?).ok()?;
    let phentsize = usize::from(u16_le(b, 0x36)?);
    let phnum = usize::from(u16_le(b, 0x38)?);
    Some((0..phnum).any(|i| u32_le(b, phoff + i * phentsize) == Some(PT_INTERP)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_dynamic_from_static() {
        // The test binary itself is linked dynamically (no crt-static in tests).
        let me = std::fs::read(std::env::current_exe().expect("current exe")).expect("read");
        assert!(has_interpreter(&me));
        assert!(!has_interpreter(b"#!/bin/sh\n"));
        assert!(!has_interpreter(b""));
    }
}
