"""SiLU-and-mul for the SwiGLU MLP."""
