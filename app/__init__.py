"""reqcrypt: encrypted block volumes over HTTP, the way device-mapper manages crypt targets."""
