from router.main import main

main()
